// Saving safetensors files and sharded checkpoints from host memory: the exact header bytes safetensors writes,
// round trips through gdskit's loader, the huggingface_hub shard split, and atomic publish under injected
// faults and SIGKILL. (GPU sources: scripts/gpu-save-test.py.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/printable.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"
#include "posix/atomic_publish.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace st = gdskit::safetensors;
namespace fs = std::filesystem;
using gdskit::test::random_bytes;
using gdskit::test::temp_dir;
using gdskit::posix::real_syscalls;
using gdskit::posix::scoped_syscalls;
using gdskit::posix::syscall_table;

namespace {

// Tensors with their own storage.
struct host_tensors {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<st::save_tensor> tensors;

  void add(std::string name, st::dtype t, std::vector<std::uint64_t> shape, std::uint64_t seed = 0) {
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= d;
    const std::size_t n = numel * st::bits_of(t) / 8;
    storage.push_back(random_bytes(n, seed ? seed : storage.size() + 11));
    tensors.push_back({std::move(name), t, std::move(shape), {}});
    // Views are fixed up once all storage exists (the vector may move its elements).
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      tensors[i].data = gdskit::buffer_view::host(storage[i].data(), storage[i].size());
    }
  }
};

std::string header_json(const std::string& file_bytes) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(file_bytes[i])} << (8 * i);
  return file_bytes.substr(8, n);
}

std::string read_text(const fs::path& p) {
  auto b = gdskit::test::read_file(p);
  return std::string(b.begin(), b.end());
}

std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".gdskit-tmp.") != std::string::npos) out.push_back(e.path().string());
  }
  return out;
}

template <class F>
std::error_code code_of(F&& f) {
  try {
    f();
  } catch (const gdskit::error& e) {
    return e.code();
  }
  return {};
}

st::save_options quiet(bool overwrite = false) {
  st::save_options o;
  o.overwrite = overwrite;
  o.config.threads = 4;
  o.config.direct = gdskit::direct_mode::off;  // the seam sees every byte
  return o;
}

// ---- the header, byte for byte --------------------------------------------------------------------------

TEST(safetensors_save_layout, the_formats_own_example) {
  // The example file of safetensors' documentation: one I32 [2,2] tensor "test".
  std::vector<std::int32_t> v(4, 0);
  std::vector<st::save_tensor> t{{"test", st::dtype::I32, {2, 2}, gdskit::buffer_view::host(v.data(), 16)}};
  auto l = st::plan_save(t, std::nullopt);
  const std::string json = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_EQ(l.header.size(), 8 + 64u);
  EXPECT_EQ(static_cast<unsigned char>(l.header[0]), 64);
  EXPECT_EQ(l.header.substr(8), json + std::string(64 - json.size(), ' '));
  EXPECT_EQ(l.file_nbytes(), 8 + 64 + 16u);
}

TEST(safetensors_save_layout, sorted_by_descending_alignment_then_name) {
  host_tensors h;
  h.add("b", st::dtype::U8, {3});
  h.add("a", st::dtype::BOOL, {2});
  h.add("z", st::dtype::F32, {1});
  h.add("c", st::dtype::F32, {1});
  h.add("y", st::dtype::U64, {1});
  h.add("f4", st::dtype::F4, {2});
  h.add("e8", st::dtype::F8_E8M0, {1});
  h.add("bf", st::dtype::BF16, {1});
  h.add("f16", st::dtype::F16, {1});
  h.add("i16", st::dtype::I16, {1});
  h.add("u16", st::dtype::U16, {1});
  h.add("c64", st::dtype::C64, {1});
  h.add("f64", st::dtype::F64, {1});
  auto l = st::plan_save(h.tensors, std::nullopt);
  std::vector<std::string> names;
  for (auto i : l.order) names.push_back(h.tensors[i].name);
  // U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8_E8M0 .. U8 F6 F4 BOOL; ties by name.
  EXPECT_EQ(names, (std::vector<std::string>{"y", "f64", "c64", "c", "z", "bf", "f16", "u16", "i16", "e8", "b", "f4",
                                             "a"}));
  // Offsets follow that order and are contiguous.
  std::uint64_t off = 0;
  for (auto i : l.order) {
    EXPECT_EQ(l.begin_bytes[i], off);
    off += h.tensors[i].data.nbytes;
  }
  EXPECT_EQ(l.data_nbytes, off);
  // Names compare as bytes: uppercase before lowercase, and non-ASCII after both.
  host_tensors g;
  g.add("\xc3\xa9", st::dtype::U8, {1});
  g.add("b", st::dtype::U8, {1});
  g.add("B", st::dtype::U8, {1});
  auto lg = st::plan_save(g.tensors, std::nullopt);
  EXPECT_EQ(lg.order, (std::vector<std::size_t>{2, 1, 0}));
}

TEST(safetensors_save_layout, metadata_first_empty_metadata_kept_padding_with_spaces) {
  host_tensors h;
  h.add("w", st::dtype::F16, {});  // 0-d: "shape":[]
  h.add("e", st::dtype::F32, {0, 3});
  auto none = header_json(st::plan_save(h.tensors, std::nullopt).header);
  EXPECT_EQ(none.substr(0, none.find_last_not_of(' ') + 1),
            R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"w":{"dtype":"F16","shape":[],"data_offsets":[0,2]}})");
  auto empty = header_json(st::plan_save(h.tensors, st::metadata_entries{}).header);
  EXPECT_TRUE(empty.starts_with(R"({"__metadata__":{},"e":)")) << empty;
  auto md = header_json(st::plan_save(h.tensors, st::metadata_entries{{"format", "pt"}, {"a", "b"}}).header);
  EXPECT_TRUE(md.starts_with(R"({"__metadata__":{"format":"pt","a":"b"},"e":)")) << md;
  for (const auto& j : {none, empty, md}) {
    EXPECT_EQ((8 + j.size()) % 8, 0u);
    EXPECT_EQ(j.find("  }"), std::string::npos);
  }
}

TEST(safetensors_save_layout, strings_escaped_as_serde_json_does) {
  host_tensors h;
  h.add("q\"b\\s/\x7f\xc3\xa9\t\n\r\b\f\x01\x1f", st::dtype::U8, {1});
  auto j = header_json(st::plan_save(h.tensors, st::metadata_entries{{"k\x02", "v\x1b"}}).header);
  EXPECT_TRUE(j.starts_with(std::string(R"({"__metadata__":{"k\u0002":"v\u001b"},"q\"b\\s/)") +
                            "\x7f\xc3\xa9" + R"(\t\n\r\b\f\u0001\u001f":{)"))
      << j;
  // What we write, our own parser reads back.
  auto l = st::plan_save(h.tensors, std::nullopt);
  std::string file = l.header + "x";
  auto parsed = st::parse_header(file.data(), file.size(), file.size(), "mem");
  EXPECT_EQ(parsed.tensors.at(0).name, h.tensors[0].name);
}

TEST(safetensors_save_layout, bad_arguments_are_einval) {
  std::vector<std::uint8_t> b(16);
  auto v = gdskit::buffer_view::host(b.data(), b.size());
  auto einval = [](std::vector<st::save_tensor> t, std::optional<st::metadata_entries> m = std::nullopt) {
    return code_of([&] { st::plan_save(t, m); });
  };
  EXPECT_EQ(einval({{"a", st::dtype::F32, {3}, v}}), std::errc::invalid_argument);          // 12 != 16
  EXPECT_EQ(einval({{"a", st::dtype::F32, {4}, v}, {"a", st::dtype::U8, {16}, v}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"", st::dtype::U8, {16}, v}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"__metadata__", st::dtype::U8, {16}, v}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"\xff", st::dtype::U8, {16}, v}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"a", st::dtype::F4, {3}, gdskit::buffer_view::host(b.data(), 1)}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"a", st::dtype::U8, {16}, {nullptr, 16}}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"a", st::dtype::U8, {16}, v}}, st::metadata_entries{{"k", "1"}, {"k", "2"}}),
            std::errc::invalid_argument);
  EXPECT_EQ(einval({{"a", st::dtype::U8, {16}, v}}, st::metadata_entries{{"k", "\xc0\x80"}}), std::errc::invalid_argument);
  EXPECT_EQ(einval({{"a", st::dtype::U8, {16}, v}}), std::error_code());
}

// ---- single-file save --------------------------------------------------------------------------------------

host_tensors every_dtype() {
  host_tensors h;
  const st::dtype all[] = {st::dtype::BOOL, st::dtype::U8, st::dtype::I8, st::dtype::F8_E5M2, st::dtype::F8_E4M3,
                           st::dtype::F8_E8M0, st::dtype::F4, st::dtype::F6_E2M3, st::dtype::F6_E3M2, st::dtype::I16,
                           st::dtype::U16, st::dtype::F16, st::dtype::BF16, st::dtype::I32, st::dtype::U32,
                           st::dtype::F32, st::dtype::C64, st::dtype::F64, st::dtype::I64, st::dtype::U64};
  for (auto t : all) {
    const std::string n(st::to_string(t));
    const bool packed = st::bits_of(t) < 8;
    h.add("m." + n, t, packed ? std::vector<std::uint64_t>{3, 8} : std::vector<std::uint64_t>{7, 13});  // unaligned
    if (!packed) h.add("s." + n, t, {});                                                              // 0-d
    h.add("e." + n, t, {2, 0});                                                                       // empty
  }
  h.add("big", st::dtype::F32, {777, 1031});  // several pieces, a ragged end
  return h;
}

void expect_round_trip(const fs::path& p, const host_tensors& h) {
  auto m = st::load(p);
  ASSERT_EQ(m.tensors().size(), h.tensors.size());
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const auto* t = m.find(h.tensors[i].name);
    ASSERT_NE(t, nullptr) << h.tensors[i].name;
    EXPECT_EQ(t->dtype, h.tensors[i].dtype);
    EXPECT_EQ(t->shape, h.tensors[i].shape);
    EXPECT_EQ(m.to_host(*t), h.storage[i]) << h.tensors[i].name;
  }
}

TEST(safetensors_save, every_dtype_round_trips_and_file_is_header_then_data) {
  temp_dir dir;
  auto h = every_dtype();
  const auto p = dir / "m.safetensors";
  st::metadata_entries md{{"format", "pt"}, {"step", "1200"}};
  auto s = st::save(p, h.tensors, md, quiet());
  expect_round_trip(p, h);
  EXPECT_EQ(st::load(p).metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "1200"}}));
  // The file is exactly the planned header followed by the data in the planned order.
  auto l = st::plan_save(h.tensors, md);
  std::string want = l.header;
  for (auto i : l.order) want.append(reinterpret_cast<const char*>(h.storage[i].data()), h.storage[i].size());
  EXPECT_EQ(read_text(p), want);
  EXPECT_EQ(s.files, 1u);
  EXPECT_EQ(s.tensor_bytes, l.data_nbytes);
  EXPECT_EQ(s.file_bytes, want.size());
  EXPECT_GT(s.pieces, h.tensors.size() / 2);
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(safetensors_save, o_direct_and_buffered_give_the_same_bytes) {
  const fs::path parent = gdskit::test::direct_capable_parent();
  if (parent.empty()) GTEST_SKIP() << "no folder here accepts O_DIRECT";
  temp_dir dir(parent);
  auto h = every_dtype();
  // Enough bytes for the gathered write to run through the pipeline of aligned slots.
  for (int i = 0; i < 3; ++i) h.add("big." + std::to_string(i), st::dtype::U8, {700001u + 4093u * i});
  auto o = quiet();
  o.config.direct = gdskit::direct_mode::automatic;
  st::save(dir / "d.safetensors", h.tensors, std::nullopt, o);
  st::save(dir / "b.safetensors", h.tensors, std::nullopt, quiet());
  EXPECT_EQ(read_text(dir / "d.safetensors"), read_text(dir / "b.safetensors"));
}

TEST(safetensors_save, sourced_tensors_give_the_same_bytes_one_view_at_a_time) {
  temp_dir dir;
  auto h = every_dtype();
  st::save(dir / "plain.safetensors", h.tensors, std::nullopt, quiet());
  // The same tensors, every second one handed out in views of at most 1000 bytes from a scratch buffer.
  auto s = h.tensors;
  std::vector<std::uint8_t> scratch(1000);
  int calls = 0, want_calls = 0;
  for (std::size_t i = 0; i < s.size(); i += 2) {
    const auto src = s[i].data;
    want_calls += static_cast<int>((src.nbytes + scratch.size() - 1) / scratch.size());
    s[i].data = {nullptr, src.nbytes, gdskit::memory_kind::host, -1};
    s[i].source = [src, &scratch, &calls](std::uint64_t off) {
      ++calls;
      const std::size_t n = std::min<std::uint64_t>(scratch.size(), src.nbytes - off);
      std::fill(scratch.begin(), scratch.end(), 0xAB);  // the previous view is dead now
      std::memcpy(scratch.data(), static_cast<const std::uint8_t*>(src.data) + off, n);
      return gdskit::buffer_view::host(scratch.data(), n);
    };
  }
  st::save(dir / "sourced.safetensors", s, std::nullopt, quiet());
  EXPECT_EQ(read_text(dir / "sourced.safetensors"), read_text(dir / "plain.safetensors"));
  EXPECT_EQ(calls, want_calls);
  EXPECT_GT(calls, 10);
  // A source that returns more than the rest is an error, and nothing is published.
  s[0].source = [&](std::uint64_t) { return gdskit::buffer_view::host(scratch.data(), scratch.size()); };
  s[0].data.nbytes = h.tensors[0].data.nbytes;
  if (s[0].data.nbytes < scratch.size()) {
    EXPECT_EQ(code_of([&] { st::save(dir / "bad.safetensors", s, std::nullopt, quiet()); }), std::errc::invalid_argument);
    EXPECT_FALSE(fs::exists(dir / "bad.safetensors"));
  }
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(safetensors_save, no_tensors_is_a_valid_file) {
  temp_dir dir;
  st::save(dir / "e.safetensors", {}, std::nullopt, quiet());
  EXPECT_EQ(read_text(dir / "e.safetensors"), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_TRUE(st::load(dir / "e.safetensors").tensors().empty());
}

TEST(safetensors_save, existing_file_needs_overwrite) {
  temp_dir dir;
  host_tensors h;
  h.add("a", st::dtype::F32, {5});
  const auto p = dir / "x.safetensors";
  gdskit::test::write_file(p, {1, 2, 3});
  EXPECT_EQ(code_of([&] { st::save(p, h.tensors, std::nullopt, quiet()); }), std::errc::file_exists);
  EXPECT_EQ(gdskit::test::read_file(p), (std::vector<std::uint8_t>{1, 2, 3}));
  st::save(p, h.tensors, std::nullopt, quiet(true));
  expect_round_trip(p, h);
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

// A save into a folder that does not exist, or onto a folder, fails before any tensor is read, naming the path
// the caller gave (never the temporary file's name).
TEST(safetensors_save, bad_targets_fail_first_naming_the_callers_path) {
  temp_dir dir;
  std::vector<std::uint8_t> bytes(64, 7);
  int reads = 0;
  std::vector<st::save_tensor> t{{"a", st::dtype::U8, {64}, {nullptr, 64, gdskit::memory_kind::host, -1}, {}}};
  t[0].source = [&](std::uint64_t off) {
    ++reads;
    return gdskit::buffer_view::host(bytes.data() + off, bytes.size() - off);
  };
  gdskit::test::write_file(dir / "plain", {1});
  const std::pair<fs::path, std::errc> cases[] = {
      {dir / "missing" / "m.safetensors", std::errc::no_such_file_or_directory},
      {dir / "plain" / "m.safetensors", std::errc::not_a_directory},
      {dir.path(), std::errc::is_a_directory},
  };
  for (const auto& [target, code] : cases) {
    SCOPED_TRACE(target.string());
    for (bool overwrite : {false, true}) {
      try {
        st::save(target, t, std::nullopt, quiet(overwrite));
        FAIL() << "saved";
      } catch (const gdskit::error& e) {
        EXPECT_EQ(e.code(), code);
        EXPECT_EQ(e.path(), target.string());
        EXPECT_EQ(std::string(e.what()).find(".gdskit-tmp."), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(reads, 0);
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

// The bytes of a save in memory equal the file, for tensors in memory and tensors handed out view by view.
TEST(safetensors_save, write_to_memory_gives_the_files_bytes) {
  temp_dir dir;
  auto h = every_dtype();
  auto strided = random_bytes(3000, 5);
  st::save_tensor s{"z.strided", st::dtype::I16, {1500}, {nullptr, 3000, gdskit::memory_kind::host, -1}, {}};
  s.source = [&](std::uint64_t off) {
    return gdskit::buffer_view::host(strided.data() + off, std::min<std::uint64_t>(777, 3000 - off));
  };
  h.tensors.push_back(s);
  const st::metadata_entries md{{"format", "pt"}, {"b", "2"}};
  st::save(dir / "m.safetensors", h.tensors, md, quiet());
  const auto layout = st::plan_save(h.tensors, md);
  std::vector<std::uint8_t> mem(layout.file_nbytes());
  st::write_to_memory(h.tensors, layout, mem.data());
  EXPECT_EQ(mem, gdskit::test::read_file(dir / "m.safetensors"));
}

TEST(safetensors_save, cancel_publishes_nothing) {
  temp_dir dir;
  auto h = every_dtype();
  auto o = quiet();
  std::atomic<int> polls{0};
  o.cancelled = [&] { return ++polls > 3; };
  EXPECT_EQ(code_of([&] { st::save(dir / "c.safetensors", h.tensors, std::nullopt, o); }), std::errc::operation_canceled);
  EXPECT_FALSE(fs::exists(dir / "c.safetensors"));
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

// ---- byte identity with files the real library wrote ---------------------------------------------------

// Each golden (tests/fixtures/safetensors/golden, written by safetensors.torch.save_file) loaded with gdskit's
// loader into host memory and saved again must come out byte for byte. The library writes "__metadata__" from
// a hash map, so its key order is taken from the golden's own header; everything else follows from the rules.
TEST(safetensors_save_golden, loaded_and_saved_again_is_byte_identical) {
  const fs::path golden = fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/safetensors/golden";
  if (!fs::exists(golden / "manifest.json")) GTEST_SKIP() << "no golden files in " << golden;
  const auto manifest = nlohmann::json::parse(read_text(golden / "manifest.json"));
  ASSERT_GE(manifest["files"].size(), 5u);
  temp_dir dir;
  for (const auto& entry : manifest["files"]) {
    const std::string name = entry["file"];
    SCOPED_TRACE(name);
    const std::string original = read_text(golden / name);
    ASSERT_EQ(original.size(), entry["nbytes"].get<std::size_t>());
    auto m = st::load(golden / name);
    std::vector<st::save_tensor> t;
    for (const auto& lt : m.tensors()) t.push_back({lt.name, lt.dtype, lt.shape, lt.data, {}});
    std::optional<st::metadata_entries> md;
    const auto header = nlohmann::ordered_json::parse(header_json(original));
    if (header.contains("__metadata__")) {
      md.emplace();
      for (const auto& [k, v] : header["__metadata__"].items()) md->emplace_back(k, v.get<std::string>());
    }
    EXPECT_EQ(entry["save_metadata"].is_null(), !md.has_value());
    st::save(dir / name, t, md, quiet());
    const std::string ours = read_text(dir / name);
    EXPECT_EQ(ours.size(), original.size());
    EXPECT_EQ(header_json(ours), header_json(original));
    EXPECT_TRUE(ours == original) << "the data section differs";
  }
}

// ---- sharded save --------------------------------------------------------------------------------------

std::vector<st::save_tensor> sized(const std::vector<std::uint64_t>& sizes, std::vector<std::uint8_t>& backing) {
  std::uint64_t total = 0;
  for (auto s : sizes) total += s;
  backing = random_bytes(total, 5);
  std::vector<st::save_tensor> out;
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out.push_back({"layer_" + std::to_string(i + 1), st::dtype::U8, {sizes[i]},
                   gdskit::buffer_view::host(backing.data() + off, sizes[i])});
    off += sizes[i];
  }
  return out;
}

TEST(safetensors_save_shards, split_follows_huggingface_hub) {
  std::vector<std::uint8_t> b;
  using groups = std::vector<std::vector<std::size_t>>;
  // huggingface_hub's own example: [6, 10, 30, 2, 2] under 10 -> [6], [30] (too big: alone), [10], [2, 2].
  EXPECT_EQ(st::plan_shards(sized({6, 10, 30, 2, 2}, b), 10), (groups{{0}, {2}, {1}, {3, 4}}));
  EXPECT_EQ(st::plan_shards(sized({6, 10, 30, 2, 2}, b), 100), (groups{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(st::plan_shards(sized({5, 5, 5}, b), 10), (groups{{0, 1}, {2}}));
  EXPECT_EQ(st::plan_shards(sized({}, b), 10), groups{});
  EXPECT_EQ(st::shard_file_name(2, 5), "model-00002-of-00005.safetensors");
  EXPECT_EQ(st::shard_file_name(1, 1), "model.safetensors");
}

TEST(safetensors_save_shards, shard_sizes_parse_like_huggingface_hub_plus_binary_units) {
  EXPECT_EQ(st::parse_shard_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(st::parse_shard_size("500MB"), 500'000'000u);
  EXPECT_EQ(st::parse_shard_size("1.5gb"), 1'500'000'000u);
  EXPECT_EQ(st::parse_shard_size(" 10KB "), 10'000u);
  EXPECT_EQ(st::parse_shard_size("2GiB"), 2ull << 30);
  EXPECT_EQ(st::parse_shard_size("4096"), 4096u);
  // 64-bit byte counts: the largest is taken exactly, anything at 2^64 or beyond is refused.
  EXPECT_EQ(st::parse_shard_size("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(st::parse_shard_size("17179869183GiB"), UINT64_MAX - (1ull << 30) + 1);  // 2^64 - 2^30
  EXPECT_EQ(st::parse_shard_size("16777216TiB"), std::nullopt);                     // 2^64
  EXPECT_EQ(st::parse_shard_size("18446744073709551TB"), std::nullopt);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1.5", "1e3MB", "5 G", "99999999999999999999TB",
                          "18446744073709551616", "18446744073709551616KB", "infGB", "nanGB", "0.0001KB"}) {
    EXPECT_EQ(st::parse_shard_size(bad), std::nullopt) << bad;
  }
}

TEST(safetensors_save_shards, files_index_and_round_trip) {
  temp_dir dir;
  std::vector<std::uint8_t> b;
  auto t = sized({6000, 10000, 30000, 2000, 2000}, b);
  auto o = quiet();
  o.max_shard_bytes = 10000;
  auto s = st::save_sharded(dir / "ckpt", t, st::metadata_entries{{"format", "pt"}}, o);
  ASSERT_EQ(s.written.size(), 5u);
  EXPECT_EQ(s.written.back(), dir / "ckpt" / "model.safetensors.index.json");
  auto j = nlohmann::json::parse(read_text(dir / "ckpt" / "model.safetensors.index.json"));
  EXPECT_EQ(j["metadata"]["total_size"], 50000);
  EXPECT_EQ(j["weight_map"]["layer_1"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(j["weight_map"]["layer_3"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(j["weight_map"]["layer_2"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(j["weight_map"]["layer_4"], "model-00004-of-00004.safetensors");
  EXPECT_EQ(j["weight_map"]["layer_5"], "model-00004-of-00004.safetensors");
  EXPECT_EQ(j.size(), 2u);
  // Shards hold at most max_shard_bytes of tensor data unless one tensor alone is larger.
  for (std::size_t k = 1; k <= 4; ++k) {
    auto h = st::read_header(dir / "ckpt" / st::shard_file_name(k, 4));
    std::uint64_t bytes = 0;
    for (const auto& ti : h.tensors) bytes += ti.nbytes();
    EXPECT_TRUE(bytes <= 10000 || h.tensors.size() == 1) << k;
    EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  }
  auto m = st::load(dir / "ckpt");
  ASSERT_EQ(m.tensors().size(), 5u);
  std::uint64_t off = 0;
  for (const auto& ti : t) {
    auto got = m.to_host(*m.find(ti.name));
    EXPECT_EQ(got, std::vector<std::uint8_t>(b.begin() + off, b.begin() + off + ti.data.nbytes)) << ti.name;
    off += ti.data.nbytes;
  }
  // Saving again needs overwrite, and nothing is touched without it.
  EXPECT_EQ(code_of([&] { st::save_sharded(dir / "ckpt", t, std::nullopt, o); }), std::errc::file_exists);
  o.overwrite = true;
  st::save_sharded(dir / "ckpt", t, std::nullopt, o);
  EXPECT_TRUE(leftovers(dir / "ckpt").empty());
}

TEST(safetensors_save_shards, one_shard_is_model_safetensors_without_index) {
  temp_dir dir;
  std::vector<std::uint8_t> b;
  auto t = sized({100, 200}, b);
  auto s = st::save_sharded(dir.path(), t, std::nullopt, quiet());
  EXPECT_EQ(s.written, (std::vector<fs::path>{dir / "model.safetensors"}));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(st::load(dir.path()).tensors().size(), 2u);
}

TEST(safetensors_save_shards, one_shard_over_a_sharded_checkpoint_removes_the_stale_index) {
  temp_dir dir;
  std::vector<std::uint8_t> b;
  auto o = quiet();
  o.max_shard_bytes = 150;
  st::save_sharded(dir.path(), sized({100, 100}, b), std::nullopt, o);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  o.max_shard_bytes = 1000;
  auto t = sized({100, 100, 100}, b);
  EXPECT_EQ(code_of([&] { st::save_sharded(dir.path(), t, std::nullopt, o); }), std::errc::file_exists);
  o.overwrite = true;
  st::save_sharded(dir.path(), t, std::nullopt, o);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(st::load(dir / "model.safetensors").tensors().size(), 3u);
  EXPECT_TRUE(fs::exists(dir / "model-00001-of-00002.safetensors"));  // old shards are left alone
}

// Names reach save errors escaped: a save of what `gdskit load` read passes the file's names through.
TEST(safetensors_save_layout, names_in_messages_are_escaped) {
  std::vector<std::uint8_t> b(16);
  auto v = gdskit::buffer_view::host(b.data(), b.size());
  const std::string evil = "x\x1b]0;owned\x07\n\xc2\x9b";
  const std::vector<std::pair<std::vector<st::save_tensor>, std::optional<st::metadata_entries>>> cases = {
      {{{evil, st::dtype::F32, {3}, v}}, std::nullopt},
      {{{evil, st::dtype::U8, {16}, v}, {evil, st::dtype::U8, {16}, v}}, std::nullopt},
      {{{evil, st::dtype::U8, {16}, {nullptr, 16}}}, std::nullopt},
      {{{evil, st::dtype::U8, {std::uint64_t{1} << 62, 1 << 8}, v}}, std::nullopt},
      {{{evil, st::dtype::F4, {3}, gdskit::buffer_view::host(b.data(), 1)}}, std::nullopt},
      {{{evil, st::dtype::U8, std::vector<std::uint64_t>(st::max_rank + 1, 1), v}}, std::nullopt},
      {{{"a", st::dtype::U8, {16}, v}}, st::metadata_entries{{evil, "1"}, {evil, "2"}}},
  };
  for (const auto& [t, m] : cases) {
    try {
      st::plan_save(t, m);
      ADD_FAILURE() << "planned";
    } catch (const gdskit::error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), std::errc::invalid_argument);
      for (char raw : {'\x1b', '\x07', '\n'}) EXPECT_EQ(what.find(raw), std::string::npos) << what;
      EXPECT_EQ(what.find("\xc2\x9b"), std::string::npos) << what;
      EXPECT_NE(what.find("x\\x1b]0;owned\\a\\n\\u009b"), std::string::npos) << what;
    }
  }
}

// The shards of a sharded checkpoint and an index that names them, nested `depth` levels deep in its metadata.
void deep_index(const fs::path& dir, std::size_t depth) {
  std::string text = "{\"metadata\": {\"total_size\": 200, \"x\": " + std::string(depth, '[') +
                     std::string(depth, ']') + "}, \"weight_map\": {\"layer_1\": \"model-00001-of-00002.safetensors\"," +
                     " \"layer_2\": \"model-00002-of-00002.safetensors\"}}";
  gdskit::test::write_text(dir / "model.safetensors.index.json", text);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Replacing a checkpoint reads the old index to keep it readable during the renames. However deeply an index in
// the folder is nested, the save neither crashes nor leaves temporary files or second names behind: an index
// nested beyond the bound is one it cannot read, and is replaced like an unparsable one.
TEST(safetensors_save_shards, a_deeply_nested_existing_index_is_replaced_cleanly) {
  for (std::size_t depth : {std::size_t{8}, std::size_t{1000000}}) {
    SCOPED_TRACE(depth);
    temp_dir dir;
    std::vector<std::uint8_t> b;
    auto o = quiet(true);
    o.max_shard_bytes = 150;
    st::save_sharded(dir.path(), sized({100, 100}, b), std::nullopt, o);
    deep_index(dir.path(), depth);
    auto t = sized({100, 100}, b);
    const auto s = st::save_sharded(dir.path(), t, std::nullopt, o);
    EXPECT_EQ(s.written.size(), 3u);
    EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                              "model-00002-of-00002.safetensors",
                                                              "model.safetensors.index.json"}));
    auto j = nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
    EXPECT_EQ(j["metadata"], (nlohmann::json{{"total_size", 200}}));
    EXPECT_EQ(st::load(dir.path()).tensors().size(), 2u);
  }
}

// A failure while the old checkpoint's shards get their second names (the second link fails) removes the names
// made so far and leaves the old checkpoint and its index as they were.
TEST(safetensors_save_faults, a_failed_second_name_leaves_no_links_behind) {
  temp_dir dir;
  std::vector<std::uint8_t> b_old, b_new;
  auto o = quiet(true);
  o.max_shard_bytes = 150;
  st::save_sharded(dir.path(), sized({100, 100, 100}, b_old), std::nullopt, o);
  std::map<std::string, std::vector<std::uint8_t>> before;
  for (const auto& e : fs::directory_iterator(dir.path())) before[e.path().filename()] = gdskit::test::read_file(e.path());
  auto t = sized({100, 100, 100}, b_new);
  auto links = std::make_shared<std::atomic<int>>(0);
  syscall_table table = real_syscalls();
  table.link = [links](const char* a, const char* c) {
    if (++*links == 2) {
      errno = EIO;
      return -1;
    }
    return real_syscalls().link(a, c);
  };
  std::error_code ec;
  {
    scoped_syscalls guard(table);
    ec = code_of([&] { st::save_sharded(dir.path(), t, std::nullopt, o); });
  }
  EXPECT_EQ(ec, std::errc::io_error);
  EXPECT_EQ(links->load(), 2);
  std::map<std::string, std::vector<std::uint8_t>> after;
  for (const auto& e : fs::directory_iterator(dir.path())) after[e.path().filename()] = gdskit::test::read_file(e.path());
  EXPECT_EQ(after, before);
}

// ---- faults at every stage -----------------------------------------------------------------------------

// The syscall seam, failing one stage of a save with `err`: reserving the file's space, data writes, the header
// write (offset 0), the data sync, the rename, the folder fsync, or any write to the index file.
enum class stage { reserve, data_write, header_write, fdatasync, rename, folder_fsync, index_write };

struct stage_fault {
  stage where;
  int err;
  std::shared_ptr<std::atomic<int>> index_fd = std::make_shared<std::atomic<int>>(-1);
  std::shared_ptr<std::atomic<int>> hits = std::make_shared<std::atomic<int>>(0);

  syscall_table table() const {
    syscall_table t = real_syscalls();
    auto fail = [this](int e) {
      ++*hits;
      errno = e;
      return -1;
    };
    auto idx = index_fd;
    t.open = [idx](const char* p, int f, mode_t m) {
      int fd = real_syscalls().open(p, f, m);
      if (std::string(p).find("index.json.gdskit-tmp") != std::string::npos) *idx = fd;
      return fd;
    };
    t.pwrite = [fail, idx, w = where, e = err](int fd, const void* b, std::size_t n, off_t o) -> ssize_t {
      if (w == stage::index_write && fd == idx->load()) return fail(e);
      if (w == stage::header_write && o == 0 && fd != idx->load()) return fail(e);
      if (w == stage::data_write && o > 0 && fd != idx->load()) return fail(e);  // the header alone is at 0
      return real_syscalls().pwrite(fd, b, n, o);
    };
    // Tensor data may also go out through io_uring (a gathered write's extents through the host engine).
    t.uring_result = [this, idx, w = where, e = err](bool is_write, int fd, std::uint64_t o, std::size_t, int result) {
      if (w == stage::data_write && is_write && o > 0 && fd != idx->load()) {
        ++*hits;
        return -e;
      }
      return result;
    };
    t.fallocate = [=, w = where, e = err](int fd, int mode, off_t o, off_t n) {
      return w == stage::reserve && fd != idx->load() ? fail(e) : real_syscalls().fallocate(fd, mode, o, n);
    };
    t.fdatasync = [=, w = where, e = err](int fd) { return w == stage::fdatasync ? fail(e) : real_syscalls().fdatasync(fd); };
    t.rename = [=, w = where, e = err](const char* a, const char* b, unsigned f) {
      return w == stage::rename ? fail(e) : real_syscalls().rename(a, b, f);
    };
    t.fsync = [=, w = where, e = err](int fd) { return w == stage::folder_fsync ? fail(e) : real_syscalls().fsync(fd); };
    return t;
  }
};

const char* name_of(stage s) {
  switch (s) {
    case stage::reserve: return "reserve";
    case stage::data_write: return "data write";
    case stage::header_write: return "header write";
    case stage::fdatasync: return "fdatasync";
    case stage::rename: return "rename";
    case stage::folder_fsync: return "folder fsync";
    case stage::index_write: return "index write";
  }
  return "";
}

TEST(safetensors_save_faults, single_file_every_stage_leaves_old_file_and_no_temporary) {
  for (int err : {ENOSPC, EIO}) {
    for (stage s : {stage::reserve, stage::data_write, stage::header_write, stage::fdatasync, stage::rename,
                    stage::folder_fsync}) {
      SCOPED_TRACE(std::string(name_of(s)) + " " + std::strerror(err));
      temp_dir dir;
      const auto p = dir / "m.safetensors";
      host_tensors old_t;
      old_t.add("old", st::dtype::F32, {100});
      st::save(p, old_t.tensors, std::nullopt, quiet());
      const auto old_bytes = gdskit::test::read_file(p);
      auto h = every_dtype();
      stage_fault f{s, err};
      std::error_code ec;
      std::string path, what;
      {
        scoped_syscalls guard(f.table());
        try {
          st::save(p, h.tensors, std::nullopt, quiet(true));
        } catch (const gdskit::error& e) {
          ec = e.code();
          path = e.path();
          what = e.what();
        }
      }
      EXPECT_EQ(ec, std::error_code(err, std::generic_category()));
      // The error names the file the caller asked for (the folder, for the folder's sync), never the temporary.
      EXPECT_EQ(path, s == stage::folder_fsync ? dir.path().string() : p.string());
      EXPECT_EQ(what.find(".gdskit-tmp."), std::string::npos) << what;
      EXPECT_GT(f.hits->load(), 0);
      EXPECT_TRUE(leftovers(dir.path()).empty());
      if (s == stage::folder_fsync) {
        // The rename happened before the folder sync failed: the new file is there, whole.
        expect_round_trip(p, h);
      } else {
        EXPECT_EQ(gdskit::test::read_file(p), old_bytes);
      }
    }
  }
}

TEST(safetensors_save_faults, sharded_every_stage_leaves_old_checkpoint_and_no_temporary) {
  for (int err : {ENOSPC, EIO}) {
    for (stage s : {stage::reserve, stage::data_write, stage::header_write, stage::fdatasync, stage::index_write}) {
      SCOPED_TRACE(std::string(name_of(s)) + " " + std::strerror(err));
      temp_dir dir;
      std::vector<std::uint8_t> b_old, b_new;
      auto o = quiet(true);
      o.max_shard_bytes = 3 << 20;
      st::save_sharded(dir.path(), sized({2 << 20, 2 << 20, 2 << 20}, b_old), std::nullopt, o);
      std::map<std::string, std::vector<std::uint8_t>> before;
      for (const auto& e : fs::directory_iterator(dir.path())) before[e.path().filename()] = gdskit::test::read_file(e.path());
      ASSERT_EQ(before.size(), 4u);
      auto t = sized({2 << 20, 2 << 20, 2 << 20}, b_new);
      for (auto& x : t) x.name += "_new";
      stage_fault f{s, err};
      std::error_code ec;
      {
        scoped_syscalls guard(f.table());
        ec = code_of([&] { st::save_sharded(dir.path(), t, std::nullopt, o); });
      }
      EXPECT_EQ(ec, std::error_code(err, std::generic_category()));
      EXPECT_TRUE(leftovers(dir.path()).empty());
      std::map<std::string, std::vector<std::uint8_t>> after;
      for (const auto& e : fs::directory_iterator(dir.path())) after[e.path().filename()] = gdskit::test::read_file(e.path());
      EXPECT_EQ(after, before);
    }
  }
}

// A disk too full for the file fails before any tensor byte is written; a file system that cannot reserve space
// (EOPNOTSUPP) still gets the whole file.
TEST(safetensors_save_faults, space_is_reserved_before_the_first_data_write) {
  temp_dir dir;
  const auto p = dir / "m.safetensors";
  auto h = every_dtype();
  auto writes = std::make_shared<std::atomic<int>>(0);
  auto reserved = std::make_shared<std::atomic<std::int64_t>>(-1);
  for (int err : {ENOSPC, EOPNOTSUPP}) {
    SCOPED_TRACE(std::strerror(err));
    writes->store(0);
    reserved->store(-1);
    syscall_table t = real_syscalls();
    t.pwrite = [writes](int fd, const void* b, std::size_t n, off_t o) -> ssize_t {
      ++*writes;
      return real_syscalls().pwrite(fd, b, n, o);
    };
    t.fallocate = [writes, reserved, err](int, int, off_t, off_t n) {
      if (writes->load() == 0) reserved->store(n);
      errno = err;
      return -1;
    };
    std::error_code ec;
    {
      scoped_syscalls guard(t);
      ec = code_of([&] { st::save(p, h.tensors, std::nullopt, quiet(true)); });
    }
    EXPECT_EQ(reserved->load(), static_cast<std::int64_t>(st::plan_save(h.tensors, std::nullopt).file_nbytes()));
    if (err == ENOSPC) {
      EXPECT_EQ(ec, std::error_code(ENOSPC, std::generic_category()));
      EXPECT_EQ(writes->load(), 0);
      EXPECT_FALSE(fs::exists(p));
    } else {
      EXPECT_FALSE(ec) << ec.message();
      expect_round_trip(p, h);
    }
    EXPECT_TRUE(leftovers(dir.path()).empty());
  }
}

// A publish whose target appeared meanwhile names both files, each escaped once: the temporary file as the
// error's path (the message escapes it), the target in the detail, so a newline in its name never reaches a
// terminal raw.
TEST(safetensors_save_faults, rename_failure_names_the_target_escaped_once) {
  temp_dir dir;
  const fs::path target = dir / "a\\b\nc.safetensors";
  auto pending = gdskit::posix::write_unpublished(target, "data", 0644, false);
  std::ofstream(target) << "someone else's";
  try {
    pending.rename();
    FAIL() << "the rename must not replace a file that appeared meanwhile";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code(), std::errc::file_exists);
    EXPECT_EQ(e.path(), pending.temp_path().string());
    EXPECT_EQ(e.detail(), "to " + gdskit::printable(target.string()));
  }
}

TEST(safetensors_save_faults, sharded_rename_failure_leaves_no_temporary_and_no_new_index) {
  temp_dir dir;
  std::vector<std::uint8_t> b;
  auto o = quiet();
  o.max_shard_bytes = 3 << 20;
  stage_fault f{stage::rename, EIO};
  {
    scoped_syscalls guard(f.table());
    EXPECT_EQ(code_of([&] { st::save_sharded(dir.path(), sized({2 << 20, 2 << 20}, b), std::nullopt, o); }),
              std::errc::io_error);
  }
  EXPECT_TRUE(leftovers(dir.path()).empty());
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
}

// ---- SIGKILL mid-save ----------------------------------------------------------------------------------

// Run in a child process (see below): saves to $GDSKIT_SAVE_KILL_TARGET slowly, and touches
// $GDSKIT_SAVE_KILL_TARGET.started once the first piece is written.
TEST(safetensors_save_kill_child, save_slowly) {
  const char* target = std::getenv("GDSKIT_SAVE_KILL_TARGET");
  if (target == nullptr) GTEST_SKIP() << "runs only as the child of safetensors_save_kill";
  const bool sharded = std::getenv("GDSKIT_SAVE_KILL_SHARDED") != nullptr;
  std::vector<std::uint8_t> b;
  auto t = sized(std::vector<std::uint64_t>(8, 4 << 20), b);
  for (auto& x : t) x.name += "_new";
  auto o = quiet(true);
  o.max_shard_bytes = 8 << 20;
  const std::string marker = std::string(target) + ".started";
  o.progress = [&](std::uint64_t, std::uint64_t) {
    if (!fs::exists(marker)) std::ofstream(marker) << "x";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  if (sharded) {
    st::save_sharded(target, t, std::nullopt, o);
  } else {
    st::save(target, t, std::nullopt, o);
  }
}

std::map<std::string, std::vector<std::uint8_t>> snapshot(const fs::path& dir) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto n = e.path().filename().string();
    if (n.find(".gdskit-") == std::string::npos && !n.ends_with(".started")) {
      out[n] = gdskit::test::read_file(e.path());
    }
  }
  return out;
}

void kill_mid_save(bool sharded) {
  const std::vector<int> delays = gdskit::test::sanitized ? std::vector<int>{0, 20, 60}
                                                          : std::vector<int>{0, 5, 20, 30, 40, 60, 150};
  for (int delay_ms : delays) {
    SCOPED_TRACE("kill " + std::to_string(delay_ms) + " ms after the first piece");
    temp_dir dir;
    const fs::path target = sharded ? dir / "ckpt" : dir / "m.safetensors";
    std::vector<std::uint8_t> b;
    auto o = quiet();
    o.max_shard_bytes = 8 << 20;
    auto t = sized(std::vector<std::uint64_t>(8, 4 << 20), b);
    if (sharded) {
      st::save_sharded(target, t, std::nullopt, o);
    } else {
      st::save(target, t, std::nullopt, o);
    }
    const auto folder = sharded ? target : dir.path();
    const auto old_files = snapshot(folder);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // A fresh program: the parent's worker threads do not exist in a forked child.
      ::setenv("GDSKIT_SAVE_KILL_TARGET", target.c_str(), 1);
      if (sharded) ::setenv("GDSKIT_SAVE_KILL_SHARDED", "1", 1);
      ::execl("/proc/self/exe", "safetensors_save_test", "--gtest_filter=safetensors_save_kill_child.*", nullptr);
      ::_exit(127);
    }
    const std::string marker = target.string() + ".started";
    const auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(marker) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(fs::exists(marker)) << "the child never started writing";
    const auto now = snapshot(folder);
    if (now == old_files) continue;  // killed before anything was published: the old checkpoint as it was
    // Otherwise what the folder names is one whole checkpoint, old or new; never some of each.
    auto m = st::load(target);
    ASSERT_EQ(m.tensors().size(), 8u);
    std::size_t fresh = 0;
    std::uint64_t off = 0;
    for (const auto& ti : t) {
      const auto* lt = m.find(ti.name);
      if (lt == nullptr) lt = m.find(ti.name + "_new");
      ASSERT_NE(lt, nullptr) << ti.name;
      fresh += lt->name.ends_with("_new");
      EXPECT_EQ(m.to_host(*lt), std::vector<std::uint8_t>(b.begin() + off, b.begin() + off + ti.data.nbytes));
      off += ti.data.nbytes;
    }
    EXPECT_TRUE(fresh == 0 || fresh == 8) << fresh << " of 8 tensors are new";
  }
}

TEST(safetensors_save_kill, single_file_is_old_or_new) { kill_mid_save(false); }
TEST(safetensors_save_kill, sharded_is_old_or_new) { kill_mid_save(true); }

// ---- the helper itself ---------------------------------------------------------------------------------

TEST(atomic_publish, discarded_unless_committed_and_exclusive_without_overwrite) {
  temp_dir dir;
  fs::path temp;
  {
    gdskit::posix::atomic_publish p(dir / "f", false);
    temp = p.temp_path();
    EXPECT_EQ(temp.parent_path(), dir.path());
    std::ofstream(temp) << "half";
  }
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_FALSE(fs::exists(dir / "f"));
  gdskit::posix::atomic_write_file(dir / "f", "one", 0600, false);
  EXPECT_EQ(read_text(dir / "f"), "one");
  EXPECT_EQ(fs::status(dir / "f").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(code_of([&] { gdskit::posix::atomic_write_file(dir / "f", "two", 0644, false); }), std::errc::file_exists);
  // A target that appears between the check and the rename is not replaced either.
  gdskit::posix::atomic_publish late(dir / "g", false);
  std::ofstream(late.temp_path()) << "mine";
  std::ofstream(dir / "g") << "theirs";
  EXPECT_EQ(code_of([&] { late.commit(-1); }), std::errc::file_exists);
  EXPECT_EQ(read_text(dir / "g"), "theirs");
  gdskit::posix::atomic_write_file(dir / "f", "two", 0644, true);
  EXPECT_EQ(read_text(dir / "f"), "two");
  EXPECT_TRUE(leftovers(dir.path()).empty() || leftovers(dir.path()).size() == 1);
}

}  // namespace
