// Loading safetensors into host memory: whole files, shards, subsets, tensor-parallel slices, caller buffers.
// Each result is compared with the bytes the test wrote. (GPU destinations: tests/gpu and
// scripts/gpu-safetensors-test.py.)
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/json_bounded.hpp"
#include "engine/thread_pool.hpp"
#include "formats/sha256.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace st = gdskit::safetensors;
using gdskit::test::random_bytes;
using gdskit::test::temp_dir;

namespace {

struct spec {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::size_t elem_bytes;
  std::size_t gap_before = 0;  // bytes of padding in the file before this tensor
};

struct written {
  std::map<std::string, std::vector<std::uint8_t>> bytes;
  std::map<std::string, spec> specs;
};

// Writes a safetensors file with random contents; returns each tensor's bytes.
written write_st(const std::filesystem::path& p, const std::vector<spec>& specs, std::uint64_t seed = 1,
                 const nlohmann::json& metadata = nullptr) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  written w;
  std::vector<std::uint8_t> data;
  for (const auto& s : specs) {
    std::size_t n = s.elem_bytes;
    for (auto d : s.shape) n *= d;
    data.resize(data.size() + s.gap_before, 0xEE);
    auto b = random_bytes(n, seed++);
    h[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.insert(data.end(), b.begin(), b.end());
    w.bytes[s.name] = std::move(b);
    w.specs[s.name] = s;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::uint8_t>(std::uint64_t{text.size()} >> (8 * i));
  file.insert(file.end(), text.begin(), text.end());
  file.insert(file.end(), data.begin(), data.end());
  gdskit::test::write_file(p, file);
  return w;
}

std::vector<std::uint8_t> view_bytes(const st::loaded_tensor& t) {
  const auto* p = static_cast<const std::uint8_t*>(t.data.data);
  return {p, p + t.data.nbytes};
}

// The reference slice: split dimension `dim` like numpy.array_split and gather rank's rows.
std::vector<std::uint8_t> ref_slice(const std::vector<std::uint8_t>& all, const std::vector<std::uint64_t>& shape,
                                    std::size_t elem, unsigned rank, unsigned world, unsigned dim) {
  if (dim >= shape.size()) return all;
  std::uint64_t outer = 1, inner = elem;
  for (unsigned i = 0; i < dim; ++i) outer *= shape[i];
  for (std::size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const std::uint64_t n = shape[dim], base = n / world, extra = n % world;
  const std::uint64_t start = rank * base + std::min<std::uint64_t>(rank, extra), count = base + (rank < extra);
  std::vector<std::uint8_t> out;
  for (std::uint64_t o = 0; o < outer; ++o) {
    auto b = all.begin() + static_cast<std::ptrdiff_t>((o * n + start) * inner);
    out.insert(out.end(), b, b + static_cast<std::ptrdiff_t>(count * inner));
  }
  return out;
}

int load_errno(const std::filesystem::path& p, const st::load_options& o) {
  try {
    st::load(p, o);
  } catch (const gdskit::error& e) {
    return e.code().value();
  }
  return 0;
}

const std::vector<spec> k_model = {
    {"embed.weight", "BF16", {64, 48}, 2},
    {"layers.0.attn.weight", "F32", {48, 48}, 4},
    {"layers.0.attn.bias", "F32", {48}, 4},
    {"layers.1.attn.weight", "F32", {48, 48}, 4, 24},  // a gap: not adjacent to the previous tensor
    {"layers.10.norm", "F16", {48}, 2},
    {"scalar", "I64", {}, 8},
    {"empty", "F32", {0, 5}, 4},
    {"flags", "BOOL", {7}, 1},
};

TEST(SafetensorsLoad, WholeFileIntoHostMemory) {
  temp_dir dir;
  auto w = write_st(dir / "m.safetensors", k_model, 1, {{"format", "pt"}});
  auto m = st::load(dir / "m.safetensors");
  ASSERT_EQ(m.tensors().size(), k_model.size());
  for (const auto& t : m.tensors()) {
    EXPECT_EQ(view_bytes(t), w.bytes.at(t.name)) << t.name;
    EXPECT_EQ(t.shape, w.specs.at(t.name).shape);
    EXPECT_EQ(t.data.kind, gdskit::memory_kind::host);
    // Every tensor is a view into the one allocation.
    auto* base = static_cast<std::uint8_t*>(m.storage().data);
    auto* p = static_cast<std::uint8_t*>(t.data.data);
    EXPECT_TRUE(p >= base && p + t.data.nbytes <= base + m.storage().nbytes) << t.name;
    EXPECT_EQ(m.sha256_hex(t), gdskit::formats::sha256::hex(w.bytes.at(t.name).data(), w.bytes.at(t.name).size()));
  }
  EXPECT_EQ(m.metadata().at("format"), "pt");
  EXPECT_EQ(m.stats().files, 1u);
  EXPECT_EQ(m.stats().path.path, gdskit::data_path::host);
  // Adjacent tensors coalesce: a small gap is read through, so the whole file is one request.
  EXPECT_EQ(m.stats().read_requests, 1u);
  EXPECT_EQ(m.find("scalar")->shape.size(), 0u);
  EXPECT_EQ(m.find("empty")->data.nbytes, 0u);
}

TEST(SafetensorsLoad, AllocateCallbackSuppliesTheStorage) {
  temp_dir dir;
  auto w = write_st(dir / "m.safetensors", k_model);
  // Misaligned on purpose: the loader must cope with whatever address the caller's allocator returns.
  std::vector<std::uint8_t> arena;
  std::uint64_t asked = 0;
  st::load_options o;
  o.slice = st::slice_spec{1, 2, 1};  // strided slices go through the gather copy into the caller's memory
  o.allocate = [&](std::uint64_t n) {
    asked = n;
    arena.assign(n + 3, 0xAB);
    return gdskit::buffer_view::host(arena.data() + 3, n);
  };
  auto m = st::load(dir / "m.safetensors", o);
  ASSERT_GT(asked, 0u);
  EXPECT_EQ(m.storage().data, arena.data() + 3);
  for (const auto& t : m.tensors()) {
    const auto& s = w.specs.at(t.name);
    EXPECT_EQ(view_bytes(t), ref_slice(w.bytes.at(t.name), s.shape, s.elem_bytes, 1, 2, 1)) << t.name;
    auto* p = static_cast<std::uint8_t*>(t.data.data);
    EXPECT_TRUE(p >= arena.data() + 3 && p + t.data.nbytes <= arena.data() + 3 + asked) << t.name;
  }
  // Too small, or the wrong kind of memory: EINVAL before any read.
  o.slice.reset();
  o.allocate = [&](std::uint64_t n) { return gdskit::buffer_view::host(arena.data(), n - 1); };
  EXPECT_EQ(load_errno(dir / "m.safetensors", o), EINVAL);
  o.allocate = [&](std::uint64_t n) { return gdskit::buffer_view{arena.data(), n, gdskit::memory_kind::device, 0}; };
  EXPECT_EQ(load_errno(dir / "m.safetensors", o), EINVAL);
}

TEST(SafetensorsLoad, NoCoalescingGivesOneReadPerRun) {
  temp_dir dir;
  auto w = write_st(dir / "m.safetensors", k_model);
  st::load_options o;
  o.coalesce_gap_bytes = 0;
  auto m = st::load(dir / "m.safetensors", o);
  EXPECT_EQ(m.stats().read_requests, 2u);  // split at the gap only
  for (const auto& t : m.tensors()) EXPECT_EQ(view_bytes(t), w.bytes.at(t.name)) << t.name;
}

TEST(SafetensorsLoad, SubsetByNameAndPrefix) {
  temp_dir dir;
  auto w = write_st(dir / "m.safetensors", k_model);
  st::load_options o;
  o.only = {"layers.1.", "scalar"};
  auto m = st::load(dir / "m.safetensors", o);
  ASSERT_EQ(m.tensors().size(), 2u);
  EXPECT_NE(m.find("layers.1.attn.weight"), nullptr);
  EXPECT_EQ(m.find("layers.10.norm"), nullptr);  // "layers.1." does not match "layers.10."
  EXPECT_EQ(view_bytes(*m.find("scalar")), w.bytes.at("scalar"));
  o.only = {"layers.1*"};
  EXPECT_EQ(st::load(dir / "m.safetensors", o).tensors().size(), 2u);  // layers.1.attn.weight, layers.10.norm
  o.only = {"nope"};
  EXPECT_EQ(load_errno(dir / "m.safetensors", o), EINVAL);
}

TEST(SafetensorsLoad, TensorParallelSlicesEveryDimAndRank) {
  temp_dir dir;
  std::vector<spec> specs = {{"w3", "F32", {5, 7, 3}, 4}, {"w2", "BF16", {10, 6}, 2}, {"b", "F16", {9}, 2},
                             {"s", "F64", {}, 8},         {"z", "F32", {0, 4}, 4},   {"big_rows", "U8", {4, 300000}, 1}};
  auto w = write_st(dir / "m.safetensors", specs);
  for (unsigned dim = 0; dim < 3; ++dim) {
    for (unsigned world : {1u, 2u, 3u, 4u}) {
      for (unsigned rank = 0; rank < world; ++rank) {
        for (std::size_t budget : {std::size_t{64} << 20, std::size_t{64}}) {
          st::load_options o;
          o.slice = st::slice_spec{rank, world, dim};
          o.staging_budget_bytes = budget;
          auto m = st::load(dir / "m.safetensors", o);
          for (const auto& t : m.tensors()) {
            const auto& s = w.specs.at(t.name);
            EXPECT_EQ(view_bytes(t), ref_slice(w.bytes.at(t.name), s.shape, s.elem_bytes, rank, world, dim))
                << t.name << " dim " << dim << " rank " << rank << "/" << world << " budget " << budget;
            EXPECT_EQ(t.full_shape, s.shape);
            if (dim < s.shape.size()) {
              std::uint64_t n = s.shape[dim];
              EXPECT_EQ(t.shape[dim], n / world + (rank < n % world ? 1 : 0));
            }
          }
        }
      }
    }
  }
}

TEST(SafetensorsLoad, SlicePlanReadsOnlyNeededRanges) {
  st::tensor_info t;
  t.name = "w";
  t.dtype = st::dtype::F32;
  t.shape = {8, 16};
  t.begin_bytes = 0;
  t.end_bytes = 8 * 16 * 4;
  auto p0 = st::plan_slice(t, st::slice_spec{1, 4, 0});  // rows 2..3: one contiguous range
  EXPECT_EQ(p0.segments, 1u);
  EXPECT_EQ(p0.first_offset, 2u * 16 * 4);
  EXPECT_EQ(p0.nbytes(), 2u * 16 * 4);
  auto p1 = st::plan_slice(t, st::slice_spec{1, 4, 1});  // columns 4..7 of every row: 8 segments
  EXPECT_EQ(p1.segments, 8u);
  EXPECT_EQ(p1.segment_bytes, 4u * 4);
  EXPECT_EQ(p1.first_offset, 4u * 4);
  EXPECT_EQ(p1.stride_bytes, 16u * 4);
  EXPECT_EQ(p1.shape, (std::vector<std::uint64_t>{8, 4}));
  // One index of the split dimension: a row of 16 floats, a column's single float; nothing when not split.
  EXPECT_EQ(p0.row_bytes, 16u * 4);
  EXPECT_EQ(p1.row_bytes, 4u);
  EXPECT_EQ(st::plan_slice(t, st::slice_spec{0, 1, 0}).row_bytes, 16u * 4);
  EXPECT_EQ(st::plan_slice(t, std::nullopt).row_bytes, 0u);
  EXPECT_EQ(st::plan_slice(t, st::slice_spec{0, 2, 2}).row_bytes, 0u);
  // Packed F4: a slice must fall on byte boundaries.
  t.dtype = st::dtype::F4;
  t.shape = {4, 2};
  t.end_bytes = 4;
  EXPECT_EQ(st::plan_slice(t, st::slice_spec{0, 2, 0}).nbytes(), 2u);  // 2 rows of 2 nibbles: 2 bytes
  t.shape = {3, 2};
  t.end_bytes = 3;
  EXPECT_NO_THROW(st::plan_slice(t, st::slice_spec{0, 2, 0}));  // rows of 2 nibbles are whole bytes
  t.shape = {2, 3};
  try {
    st::plan_slice(t, st::slice_spec{0, 2, 1});  // rows of 1 nibble
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
  }
  try {
    st::plan_slice(t, st::slice_spec{2, 2, 0});
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
  }
}

TEST(SafetensorsLoad, SplitRowsIsNumpyArraySplit) {
  // 10 rows over 4 ranks: 3, 3, 2, 2 (the first n % world ranks get one more).
  const std::pair<std::uint64_t, std::uint64_t> want[] = {{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  for (unsigned r = 0; r < 4; ++r) EXPECT_EQ(st::split_rows(10, r, 4), want[r]) << r;
  EXPECT_EQ(st::split_rows(2, 3, 4), (std::pair<std::uint64_t, std::uint64_t>{2, 0}));  // more ranks than rows
  EXPECT_EQ(st::split_rows(UINT64_MAX, 1, 2), (std::pair<std::uint64_t, std::uint64_t>{UINT64_MAX / 2 + 1, UINT64_MAX / 2}));
  for (auto [rank, world] : {std::pair<unsigned, unsigned>{0, 0}, {4, 4}}) {
    try {
      st::split_rows(10, rank, world);
      FAIL() << rank << " of " << world;
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), EINVAL);
    }
  }
}

TEST(SafetensorsLoad, NameMatchesOnlyEntries) {
  EXPECT_TRUE(st::name_matches("model.embed", "model.embed"));
  EXPECT_FALSE(st::name_matches("model.embed", "model.embed.weight"));  // no '.' or '*': the name itself
  EXPECT_TRUE(st::name_matches("model.layers.", "model.layers.0.w"));
  EXPECT_FALSE(st::name_matches("model.layers.", "model.layers"));     // the '.' is kept
  EXPECT_TRUE(st::name_matches("model.lay*", "model.layers"));
  EXPECT_TRUE(st::name_matches("*", "anything"));
  EXPECT_FALSE(st::name_matches("", ""));                              // an empty entry selects nothing
}

TEST(SafetensorsLoad, ShardedCheckpointThroughIndex) {
  temp_dir dir;
  auto w1 = write_st(dir / "model-00001-of-00002.safetensors", {k_model[0], k_model[1], k_model[2]}, 10);
  auto w2 = write_st(dir / "model-00002-of-00002.safetensors", {k_model[3], k_model[4], k_model[5]}, 20);
  nlohmann::json idx = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [n, _] : w1.bytes) idx["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, _] : w2.bytes) idx["weight_map"][n] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump(2);
  for (const auto& path : {dir.path(), dir / "model.safetensors.index.json"}) {
    auto m = st::load(path);
    EXPECT_EQ(m.tensors().size(), 6u);
    EXPECT_EQ(m.stats().files, 2u);
    for (const auto& t : m.tensors()) {
      const auto& want = w1.bytes.count(t.name) ? w1.bytes.at(t.name) : w2.bytes.at(t.name);
      EXPECT_EQ(view_bytes(t), want) << t.name;
    }
  }
  st::load_options o;
  o.only = {"layers."};
  EXPECT_EQ(st::load(dir.path(), o).tensors().size(), 4u);
  // The index names a tensor its shard lacks.
  idx["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump(2);
  EXPECT_EQ(load_errno(dir.path(), {}), EBADMSG);
  // An index that escapes the folder.
  idx["weight_map"].erase("ghost");
  idx["weight_map"]["scalar"] = "../x.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump(2);
  EXPECT_EQ(load_errno(dir.path(), {}), EBADMSG);
}

TEST(SafetensorsLoad, FolderWithoutIndexLoadsEveryFileAndRejectsDuplicates) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  write_st(dir / "b.safetensors", {k_model[1]}, 2);
  EXPECT_EQ(st::load(dir.path()).tensors().size(), 2u);
  write_st(dir / "c.safetensors", {k_model[1]}, 3);  // same name in two files
  EXPECT_EQ(load_errno(dir.path(), {}), EBADMSG);
  temp_dir empty;
  EXPECT_EQ(load_errno(empty.path(), {}), ENOENT);
}

TEST(SafetensorsLoad, CallerProvidedDestinations) {
  temp_dir dir;
  auto w = write_st(dir / "m.safetensors", k_model);
  std::vector<std::uint8_t> a(w.bytes.at("embed.weight").size()), b(w.bytes.at("scalar").size() + 10, 0x11);
  std::map<std::string, gdskit::buffer_view> dst = {{"embed.weight", gdskit::buffer_view::host(a.data(), a.size())},
                                                    {"scalar", gdskit::buffer_view::host(b.data(), b.size())}};
  auto stats = st::load_into(dir / "m.safetensors", dst);
  EXPECT_EQ(a, w.bytes.at("embed.weight"));
  EXPECT_TRUE(std::equal(w.bytes.at("scalar").begin(), w.bytes.at("scalar").end(), b.begin()));
  EXPECT_EQ(b.back(), 0x11);  // nothing written past the tensor
  EXPECT_EQ(stats.tensor_bytes, a.size() + 8);
  // Sliced into a caller buffer (dim 1: strided).
  st::load_options o;
  o.slice = st::slice_spec{1, 3, 1};
  std::vector<std::uint8_t> s(64 * 16 * 2);
  st::load_into(dir / "m.safetensors", {{"embed.weight", gdskit::buffer_view::host(s.data(), s.size())}}, o);
  EXPECT_EQ(s, ref_slice(w.bytes.at("embed.weight"), {64, 48}, 2, 1, 3, 1));
  // Too small, or unknown.
  std::vector<std::uint8_t> small(3);
  try {
    st::load_into(dir / "m.safetensors", {{"scalar", gdskit::buffer_view::host(small.data(), small.size())}});
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
  }
  try {
    st::load_into(dir / "m.safetensors", {{"nope", gdskit::buffer_view::host(small.data(), small.size())}});
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
  }
}

TEST(SafetensorsLoad, LargeRandomFileWithUnalignedTensors) {
  temp_dir dir;
  std::vector<spec> specs;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 40; ++i) {
    specs.push_back({"t" + std::to_string(i), "U8", {1 + rng() % 300000}, 1, static_cast<std::size_t>(rng() % 3 ? 0 : rng() % 100000)});
  }
  auto w = write_st(dir / "m.safetensors", specs, 99);
  auto m = st::load(dir / "m.safetensors");
  for (const auto& t : m.tensors()) EXPECT_EQ(view_bytes(t), w.bytes.at(t.name)) << t.name;
}

// A random checkpoint with an index: 2 to 5 shards of 1 to `max_tensors` 2-D tensors of `dtype` (`elem` bytes an
// element), up to `max_rows` x `max_cols`, half of them after a gap of up to `max_gap` bytes.
struct random_checkpoint {
  int nfiles = 0;
  std::map<std::string, std::vector<std::uint8_t>> bytes;
  std::map<std::string, std::vector<std::uint64_t>> shapes;
  std::map<std::string, int> shard_of;
};

random_checkpoint write_random_checkpoint(const temp_dir& dir, std::mt19937_64& rng, const std::string& dtype,
                                          std::size_t elem, int max_tensors, std::uint64_t max_rows,
                                          std::uint64_t max_cols, std::size_t max_gap) {
  random_checkpoint c;
  c.nfiles = 2 + static_cast<int>(rng() % 4);
  nlohmann::json idx = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (int f = 0; f < c.nfiles; ++f) {
    std::vector<spec> specs;
    const int n = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(max_tensors));
    for (int i = 0; i < n; ++i) {
      const std::uint64_t rows = 1 + rng() % max_rows, cols = 1 + rng() % max_cols;
      specs.push_back({fmt::format("f{}.t{}", f, i), dtype, {rows, cols}, elem,
                       static_cast<std::size_t>(rng() % 2 ? 0 : rng() % max_gap)});
      c.shapes[specs.back().name] = {rows, cols};
      c.shard_of[specs.back().name] = f;
    }
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, c.nfiles);
    auto w = write_st(dir / name, specs, rng());
    for (auto& [k, v] : w.bytes) {
      idx["weight_map"][k] = name;
      c.bytes[k] = v;
    }
  }
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  return c;
}

// One pipeline across shards: random checkpoints of several files with unaligned tensors, read as segments
// small enough that every file boundary falls inside the pipeline; whole loads, subsets and tensor-parallel
// slices must stay byte-exact, and no more segments than the pipeline's depth (and the shard before's last) may
// read at once.
TEST(SafetensorsLoad, CrossFilePipelineIsByteExactOnRandomShards) {
  std::mt19937_64 rng(77);
  for (int round = 0; round < 4; ++round) {
    temp_dir dir;
    const auto c = write_random_checkpoint(dir, rng, "BF16", 2, 6, 700, 300, 200000);
    const int nfiles = c.nfiles;
    const auto& all = c.bytes;
    const auto& shapes = c.shapes;
    st::load_options o;
    o.pipeline_segment_bytes = std::size_t{64} << 10;
    o.pipeline_depth = 1 + static_cast<unsigned>(round % 3);
    auto m = st::load(dir.path(), o);
    ASSERT_EQ(m.tensors().size(), all.size());
    for (const auto& t : m.tensors()) EXPECT_EQ(view_bytes(t), all.at(t.name)) << t.name;
    EXPECT_GE(m.stats().segments, static_cast<std::size_t>(nfiles));
    // How many overlap is timing; never more than the depth and the last segment of the shard before.
    EXPECT_LE(m.stats().peak_segments_in_flight, o.pipeline_depth + 1);
    // Rank-local slices (dim 0: contiguous rows; dim 1: strided) through the same pipeline.
    for (unsigned dim : {0u, 1u}) {
      const unsigned world = 2 + static_cast<unsigned>(rng() % 3), rank = static_cast<unsigned>(rng() % world);
      o.slice = st::slice_spec{rank, world, dim};
      auto ms = st::load(dir.path(), o);
      for (const auto& t : ms.tensors()) {
        EXPECT_EQ(view_bytes(t), ref_slice(all.at(t.name), shapes.at(t.name), 2, rank, world, dim)) << t.name;
      }
    }
    o.slice.reset();
  }
}

// A checkpoint of `nfiles` shards with an index, each of `per_file` U8 tensors of `nbytes` bytes (odd sizes
// leave every later tensor unaligned), and where each file's data section starts.
struct checkpoint {
  std::vector<std::filesystem::path> files;  // canonical, as /proc/self/fd names them
  std::vector<std::uint64_t> data_offsets;
  std::map<std::string, std::vector<std::uint8_t>> bytes;
};

checkpoint write_checkpoint(const temp_dir& dir, int nfiles, int per_file, std::uint64_t nbytes) {
  checkpoint c;
  nlohmann::json idx = {{"weight_map", nlohmann::json::object()}};
  for (int f = 0; f < nfiles; ++f) {
    std::vector<spec> specs;
    for (int i = 0; i < per_file; ++i) specs.push_back({fmt::format("s{}.t{}", f, i), "U8", {nbytes}, 1});
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, nfiles);
    auto w = write_st(dir / name, specs, 1000 + f * 100);
    for (auto& [k, v] : w.bytes) {
      idx["weight_map"][k] = name;
      c.bytes[k] = std::move(v);
    }
    c.files.push_back(std::filesystem::canonical(dir / name));
    c.data_offsets.push_back(st::read_header(dir / name).data_offset_bytes);
  }
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  return c;
}

// Settings under which every read of a load reaches the pread seam.
gdskit::settings seam_settings() {
  gdskit::settings s;
  s.engine = gdskit::engine_kind::threads;
  s.direct = gdskit::direct_mode::off;
  return s;
}

// One pread of a checkpoint's shard: which shard, and whether it reads its header or its data.
struct shard_read {
  std::size_t shard = 0;
  bool header = false;
  std::uint64_t end = 0;  // where the read ends in the file
};

// A pread seam over a checkpoint: records each read of its shards in order, counts data reads in flight, and
// lets a test hold a read back (until another has happened) or fail it with an errno.
class shard_reads {
 public:
  explicit shard_reads(const checkpoint& c) : c_(c) {}

  // Runs before each read of a shard is recorded, outside the seam's lock; returns 0 to read, or the errno to
  // fail with.
  std::function<int(const shard_read&)> before;

  gdskit::posix::syscall_table table() {
    auto t = gdskit::posix::real_syscalls();
    t.pread = [this](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
      const auto shard = shard_of(fd);
      if (!shard) return gdskit::posix::real_syscalls().pread(fd, b, n, o);
      const shard_read r{*shard, static_cast<std::uint64_t>(o) < c_.data_offsets[*shard], static_cast<std::uint64_t>(o) + n};
      // Recorded once the hook lets it go: the order of events is the order the reads reached the file.
      const int err = before ? before(r) : 0;
      {
        std::lock_guard lock(mutex_);
        events_.push_back(r);
        if (!r.header) {
          ++data_in_flight_;
          data_threads_.insert(std::this_thread::get_id());
        }
      }
      cv_.notify_all();
      ssize_t got = -1;
      if (err != 0) {
        errno = err;
      } else {
        got = gdskit::posix::real_syscalls().pread(fd, b, n, o);
      }
      if (!r.header) {
        const int saved = errno;
        std::lock_guard lock(mutex_);
        --data_in_flight_;
        ++data_reads_;
        errno = saved;
      }
      return got;
    };
    return t;
  }

  // Waits up to `timeout` for a data read of `shard` to have started; false if none did.
  bool wait_for_data(std::size_t shard, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] {
      return std::any_of(events_.begin(), events_.end(),
                         [&](const shard_read& e) { return e.shard == shard && !e.header; });
    });
  }

  // Position of the first read of `shard` of that kind in the order of events, or SIZE_MAX.
  std::size_t first(std::size_t shard, bool header) const {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < events_.size(); ++i) {
      if (events_[i].shard == shard && events_[i].header == header) return i;
    }
    return SIZE_MAX;
  }
  std::size_t events() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  int data_in_flight() const {
    std::lock_guard lock(mutex_);
    return data_in_flight_;
  }
  int data_reads() const {
    std::lock_guard lock(mutex_);
    return data_reads_;
  }
  // The threads data reads ran on.
  std::set<std::thread::id> data_threads() const {
    std::lock_guard lock(mutex_);
    return data_threads_;
  }

 private:
  std::optional<std::size_t> shard_of(int fd) const {
    char buf[4096];
    const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    const std::filesystem::path p(std::string(buf, static_cast<std::size_t>(n)));
    for (std::size_t i = 0; i < c_.files.size(); ++i) {
      if (c_.files[i] == p) return i;
    }
    return std::nullopt;
  }

  const checkpoint& c_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<shard_read> events_;
  int data_in_flight_ = 0;
  int data_reads_ = 0;
  std::set<std::thread::id> data_threads_;
};

// Threads of this process.
std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The load streams: the first shard's data is read while the second shard's header is still to be parsed,
// and each shard's memory comes from the caller's allocator on the calling thread after its header. The seam
// holds the second shard's header read back until a data read of the first has started (for at most 5 s):
// a loader that parses every header before reading any data waits that long and then reads them in the wrong
// order.
TEST(SafetensorsLoad, FirstShardReadsBeforeLaterHeadersAreParsed) {
  temp_dir dir;
  const auto c = write_checkpoint(dir, 3, 4, 100001);
  shard_reads reads(c);
  reads.before = [&](const shard_read& r) {
    if (r.header && r.shard == 1) reads.wait_for_data(0, std::chrono::seconds(5));
    return 0;
  };
  struct allocation_call {
    std::size_t after_events;  // reads the seam had seen when the callback ran
    std::thread::id thread;
  };
  std::vector<allocation_call> calls;
  std::vector<std::vector<std::uint8_t>> arenas;
  st::load_options o;
  o.config = seam_settings();
  o.pipeline_segment_bytes = 64 << 10;
  o.allocate = [&](std::uint64_t n) {
    calls.push_back({reads.events(), std::this_thread::get_id()});
    arenas.emplace_back(n);
    return gdskit::buffer_view::host(arenas.back().data(), n);
  };
  st::model m;
  {
    gdskit::posix::scoped_syscalls seam(reads.table());
    m = st::load(dir.path(), o);
  }
  for (const auto& t : m.tensors()) EXPECT_EQ(view_bytes(t), c.bytes.at(t.name)) << t.name;
  ASSERT_NE(reads.first(0, false), SIZE_MAX);
  EXPECT_LT(reads.first(0, false), reads.first(1, true)) << "shard 2's header was read before any data of shard 1";
  // One allocation per shard, each after its own header and on the thread that called load().
  ASSERT_EQ(calls.size(), 3u);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    EXPECT_EQ(calls[k].thread, std::this_thread::get_id()) << "allocation " << k;
    EXPECT_GT(calls[k].after_events, reads.first(k, true)) << "allocation " << k;
    if (k + 1 < calls.size()) EXPECT_LE(calls[k].after_events, reads.first(k + 1, true)) << "allocation " << k;
  }
  EXPECT_EQ(m.allocations().size(), 3u);
}

// The stats of a streamed load: the first read comes after the first header; the second shard's header work
// is counted as overlapped with reads. The seam holds each of that header's two reads back until a data read of
// shard 1 has begun, then for 5 ms; shard 1's data reads wait until both header reads have been let go, so the
// reads stay busy through those 10 ms however the core groups or spreads them.
TEST(SafetensorsLoad, StreamingStatsCountHeaderWorkOverlappedWithReads) {
  temp_dir dir;
  const auto c = write_checkpoint(dir, 3, 4, 100001);
  shard_reads reads(c);
  std::atomic<bool> data_begun{false};
  std::atomic<int> headers_let_go{0};
  const auto spin_until = [](const auto& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  reads.before = [&](const shard_read& r) {
    if (r.header && r.shard == 1) {
      spin_until([&] { return data_begun.load(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      headers_let_go.fetch_add(1);
    }
    if (!r.header && r.shard == 0) {
      data_begun = true;
      spin_until([&] { return headers_let_go.load() >= 2; });
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return 0;
  };
  st::load_options o;
  o.config = seam_settings();
  o.pipeline_segment_bytes = 16 << 10;
  st::model m;
  {
    gdskit::posix::scoped_syscalls seam(reads.table());
    m = st::load(dir.path(), o);
  }
  const auto& s = m.stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(m.allocations().size(), 3u);
  EXPECT_GT(s.first_read_seconds, 0.0);
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_GT(s.overlapped_seconds, 0.009);  // at least the two 5 ms the seam held shard 2's header reads
  EXPECT_LE(s.overlapped_seconds, s.header_seconds + s.alloc_seconds);
  EXPECT_EQ(s.tensor_bytes, 12u * 100001);
  EXPECT_GE(s.segments, 3u * (4 * 100001 / (16 << 10)));
  // A single file of one segment: one allocation, no header work behind reads, and no thread started for it:
  // it is read on the calling thread.
  shard_reads single(c);
  st::model one;
  {
    gdskit::posix::scoped_syscalls seam(single.table());
    one = st::load(c.files[0], st::load_options{.config = seam_settings()});
  }
  EXPECT_EQ(one.stats().allocations, 1u);
  EXPECT_EQ(one.stats().segments, 1u);
  EXPECT_EQ(one.stats().overlapped_seconds, 0.0);
  EXPECT_EQ(one.storage().data, one.allocations().at(0).data);
  EXPECT_EQ(single.data_threads(), std::set<std::thread::id>{std::this_thread::get_id()});
}

// The segment pipeline runs across files: the next shard's first segment starts while the shard before it still
// reads its last one (the device's queue does not drain at a file boundary), and no more than pipeline_depth
// segments and that last one read at once.
TEST(SafetensorsLoad, TheNextShardStartsBeforeTheShardBeforeItHasEnded) {
  temp_dir dir;
  // Segments of 4 MiB: each one range of its batch that no other joins, so a shard's segments end one by one.
  const auto c = write_checkpoint(dir, 3, 3, std::uint64_t{4} << 20);
  shard_reads reads(c);
  std::mutex m;
  std::condition_variable cv;
  std::map<std::size_t, int> reading;  // data reads under way per shard
  bool crossed = false;
  int most = 0;
  reads.before = [&](const shard_read& r) {
    if (r.header) return 0;
    std::unique_lock lock(m);
    int all = 1;
    for (const auto& [shard, n] : reading) {
      all += n;
      if (shard != r.shard && n > 0) crossed = true;
    }
    most = std::max(most, all);
    ++reading[r.shard];
    cv.notify_all();
    // A shard's last read (but the last shard's) is held until another shard's read starts, 5 s at most: the
    // next shard's first segment must start while it still reads, however slowly this machine runs.
    const bool last = r.end >= std::filesystem::file_size(c.files[r.shard]);
    if (last && r.shard + 1 < c.files.size()) {
      cv.wait_for(lock, std::chrono::seconds(5), [&] { return crossed; });
    } else {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      lock.lock();
    }
    --reading[r.shard];
    return 0;
  };
  st::load_options o;
  o.config = seam_settings();
  o.pipeline_segment_bytes = std::size_t{4} << 20;
  o.pipeline_depth = 2;
  st::model model;
  {
    gdskit::posix::scoped_syscalls seam(reads.table());
    model = st::load(dir.path(), o);
  }
  for (const auto& t : model.tensors()) EXPECT_EQ(view_bytes(t), c.bytes.at(t.name)) << t.name;
  EXPECT_TRUE(crossed) << "no segment of a shard read while the shard before it was still reading";
  EXPECT_LE(most, 3);
  EXPECT_LE(model.stats().peak_segments_in_flight, 3u);
}

// A malformed header in shard 3 of 4 fails the load with the error the header alone gives, after shards 1 and
// 2 started reading; when load() throws no read is running or starts later and its threads are gone.
TEST(SafetensorsLoad, MalformedLaterHeaderStopsTheReadsOfEarlierShards) {
  temp_dir dir;
  const auto c = write_checkpoint(dir, 4, 4, 100001);
  std::vector<std::uint8_t> bad = gdskit::test::read_file(c.files[2]);
  const std::string json = R"({"s2.t0":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}})";  // span != numel
  bad.assign(8, 0);
  bad[0] = static_cast<std::uint8_t>(json.size());
  bad.insert(bad.end(), json.begin(), json.end());
  gdskit::test::write_file(c.files[2], bad);
  std::string expected;
  try {
    st::read_header(c.files[2]);
    FAIL() << "the malformed header parsed";
  } catch (const gdskit::error& e) {
    ASSERT_EQ(e.code().value(), EBADMSG);
    expected = e.what();
  }
  shard_reads reads(c);
  reads.before = [&](const shard_read& r) {
    if (r.header && r.shard == 2) reads.wait_for_data(1, std::chrono::seconds(5));
    if (!r.header) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return 0;
  };
  st::load_options o;
  o.config = seam_settings();
  o.pipeline_segment_bytes = 64 << 10;
  // A first thread started and joined before counting: runtimes that start a helper thread of their own at the
  // first thread creation (ThreadSanitizer's) have done so, and only the load's threads are counted.
  std::thread([] {}).join();
  const std::size_t threads_before = thread_count();
  const unsigned pool_before = gdskit::engine::shared_pool(0).size();
  {
    gdskit::posix::scoped_syscalls seam(reads.table());
    try {
      st::load(dir.path(), o);
      ADD_FAILURE() << "a checkpoint with a malformed shard loaded";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), EBADMSG);
      EXPECT_EQ(std::string(e.what()), expected);
    }
    EXPECT_EQ(reads.data_in_flight(), 0);
    const int done = reads.data_reads();
    EXPECT_GT(done, 0) << "shards 1 and 2 were not read while shard 3's header was parsed";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(reads.data_reads(), done) << "reads went on after load() threw";
    EXPECT_EQ(reads.first(3, true), SIZE_MAX) << "shard 4 was opened after shard 3 failed";
  }
  EXPECT_EQ(thread_count(), threads_before + (gdskit::engine::shared_pool(0).size() - pool_before));
}

// A name in two shards is refused while streaming too: when the later shard's header arrives, before any of
// its memory is allocated (so none of its tensors is handed out). Without the duplicate among the selected
// names the folder loads.
TEST(SafetensorsLoad, NameInTwoShardsIsRefusedBeforeTheLaterShardIsAllocated) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {{"a.big", "U8", {300001}, 1}, k_model[0]}, 1);
  write_st(dir / "b.safetensors", {{"b.big", "U8", {300001}, 1}}, 2);
  write_st(dir / "c.safetensors", {{"c.big", "U8", {300001}, 1}, k_model[0]}, 3);
  std::vector<std::uint64_t> asked;
  std::vector<std::vector<std::uint8_t>> arenas;
  st::load_options o;
  o.pipeline_segment_bytes = 64 << 10;
  o.allocate = [&](std::uint64_t n) {
    asked.push_back(n);
    arenas.emplace_back(n);
    return gdskit::buffer_view::host(arenas.back().data(), n);
  };
  try {
    st::load(dir.path(), o);
    FAIL() << "a name in two shards loaded";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EBADMSG);
    EXPECT_NE(std::string(e.what()).find("c.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("embed.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(asked.size(), 2u);  // a and b; c was refused before its allocation
  asked.clear();
  o.only = {"a.", "b.", "c.", "embed.weight"};
  EXPECT_EQ(load_errno(dir.path(), o), EBADMSG);
  o.only = {"a.", "b.", "c."};
  auto m = st::load(dir.path(), o);
  EXPECT_EQ(m.tensors().size(), 3u);
  EXPECT_EQ(m.allocations().size(), 3u);
}

// Which error wins when several things fail: a shard's open, header or selection (the first such shard),
// then an `only` entry that matches nothing, then an allocation, then the first failing read (by shard and
// offset): the order a load that parsed every header before reading gave.
TEST(SafetensorsLoad, FirstErrorInLoadOrderWins) {
  temp_dir dir;
  const auto c = write_checkpoint(dir, 4, 3, 100001);
  auto load_error = [&](std::set<std::size_t> failing_shards,
                        const st::load_options& o) -> std::pair<int, std::string> {
    shard_reads reads(c);
    reads.before = [&](const shard_read& r) { return !r.header && failing_shards.count(r.shard) ? EIO : 0; };
    gdskit::posix::scoped_syscalls seam(reads.table());
    std::pair<int, std::string> out{0, ""};
    try {
      st::load(dir.path(), o);
    } catch (const gdskit::error& e) {
      out = {e.code().value(), e.what()};
    }
    EXPECT_EQ(reads.data_in_flight(), 0);
    return out;
  };
  st::load_options o;
  o.config = seam_settings();
  o.pipeline_segment_bytes = 64 << 10;
  auto [code, what] = load_error({1}, o);
  EXPECT_EQ(code, EIO);
  EXPECT_NE(what.find(c.files[1].filename().string()), std::string::npos) << what;
  std::tie(code, what) = load_error({1, 2}, o);
  EXPECT_EQ(code, EIO);
  EXPECT_NE(what.find(c.files[1].filename().string()), std::string::npos) << what;
  // An allocation failing for shard 3 wins over reads failing in shard 2.
  int calls = 0;
  std::vector<std::vector<std::uint8_t>> arenas;
  o.allocate = [&](std::uint64_t n) -> gdskit::buffer_view {
    if (++calls == 3) throw gdskit::error(gdskit::errno_code(ENOMEM), "test allocation");
    arenas.emplace_back(n);
    return gdskit::buffer_view::host(arenas.back().data(), n);
  };
  std::tie(code, what) = load_error({1}, o);
  EXPECT_EQ(code, ENOMEM);
  // An `only` entry that matches nothing wins over a failing read and allocation.
  calls = 0;
  o.only = {"s0.", "s1.", "s2.", "s3.", "nothing.*"};
  std::tie(code, what) = load_error({0}, o);
  EXPECT_EQ(code, EINVAL);
  // A malformed header in shard 4 wins over everything before it.
  auto bad = gdskit::test::read_file(c.files[3]);
  bad[8] = '[';
  gdskit::test::write_file(c.files[3], bad);
  calls = 0;
  std::tie(code, what) = load_error({0, 1}, o);
  EXPECT_EQ(code, EBADMSG);
  EXPECT_NE(what.find(c.files[3].filename().string()), std::string::npos) << what;
}

// Streaming into the caller's memory on random checkpoints: unaligned tensors, subsets that leave whole
// shards out, and slices, each allocation misaligned on purpose. One allocation per shard with selected
// tensors, every tensor inside its own shard's, every byte as written.
TEST(SafetensorsLoad, StreamingIntoCallerAllocationsIsByteExactOnRandomShards) {
  std::mt19937_64 rng(91);
  for (int round = 0; round < 6; ++round) {
    temp_dir dir;
    const auto c = write_random_checkpoint(dir, rng, "U8", 1, 5, 400, 301, 5000);
    st::load_options o;
    o.pipeline_segment_bytes = std::size_t{16} << 10;
    o.pipeline_depth = 1 + static_cast<unsigned>(round % 3);
    std::set<int> selected;
    if (round % 2 == 1) {
      // Every other shard: the ones left out get no allocation.
      for (int f = 0; f < c.nfiles; f += 2) {
        o.only.push_back(fmt::format("f{}.", f));
        selected.insert(f);
      }
    } else {
      for (int f = 0; f < c.nfiles; ++f) selected.insert(f);
    }
    const unsigned dim = round % 3 == 0 ? 0u : 1u, world = 2 + static_cast<unsigned>(rng() % 3);
    const unsigned rank = static_cast<unsigned>(rng() % world);
    if (round >= 2) o.slice = st::slice_spec{rank, world, dim};
    std::vector<std::pair<std::uint8_t*, std::uint64_t>> given;
    std::vector<std::unique_ptr<std::uint8_t[]>> arenas;
    o.allocate = [&, caller = std::this_thread::get_id()](std::uint64_t n) {
      EXPECT_EQ(std::this_thread::get_id(), caller);
      const std::size_t skew = 1 + rng() % 7;
      arenas.emplace_back(new std::uint8_t[n + skew]);
      given.emplace_back(arenas.back().get() + skew, n);
      return gdskit::buffer_view::host(given.back().first, n);
    };
    auto m = st::load(dir.path(), o);
    ASSERT_EQ(given.size(), selected.size()) << "round " << round;
    ASSERT_EQ(m.allocations().size(), given.size());
    std::size_t expected_tensors = 0;
    for (const auto& [k, f] : c.shard_of) expected_tensors += selected.count(f);
    ASSERT_EQ(m.tensors().size(), expected_tensors);
    int last_shard = -1;
    for (const auto& t : m.tensors()) {
      const int f = c.shard_of.at(t.name);
      EXPECT_GE(f, last_shard) << "tensors out of file order";
      last_shard = f;
      const auto rank_in = static_cast<std::size_t>(std::distance(selected.begin(), selected.find(f)));
      const auto [base, n] = given.at(rank_in);
      const auto* p = static_cast<const std::uint8_t*>(t.data.data);
      EXPECT_TRUE(p >= base && p + t.data.nbytes <= base + n) << t.name << " outside its shard's allocation";
      const auto want = o.slice ? ref_slice(c.bytes.at(t.name), c.shapes.at(t.name), 1, rank, world, dim)
                                 : c.bytes.at(t.name);
      EXPECT_EQ(view_bytes(t), want) << t.name << " round " << round;
    }
  }
}

TEST(SafetensorsLoad, MalformedFileFailsWithEbadmsg) {
  temp_dir dir;
  gdskit::test::write_file(dir / "bad.safetensors", {3, 0, 0, 0, 0, 0, 0, 0, '{', '}'});
  EXPECT_EQ(load_errno(dir / "bad.safetensors", {}), EBADMSG);
  EXPECT_EQ(load_errno(dir / "missing.safetensors", {}), ENOENT);
}

// The error of loading `p`, which must name `p` (0 when it loads).
int load_errno_naming(const std::filesystem::path& p, const std::filesystem::path& named) {
  try {
    st::load(p);
  } catch (const gdskit::error& e) {
    EXPECT_NE(std::string(e.what()).find(named.filename().string()), std::string::npos) << e.what();
    return e.code().value();
  }
  return 0;
}

TEST(SafetensorsLoad, FifoShardIsRefusedWithoutBlocking) {
  temp_dir dir;
  const auto fifo = dir / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto pending = std::async(std::launch::async, [&] { return load_errno_naming(fifo, fifo); });
  if (pending.wait_for(std::chrono::seconds(20)) == std::future_status::timeout) {
    // Release the blocked open so the test ends: a writer that closes at once gives the reader end-of-file.
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    pending.wait();
    FAIL() << "load blocked on a FIFO";
  }
  EXPECT_EQ(pending.get(), EINVAL);
  // The header reader refuses it the same way.
  try {
    st::read_header(fifo);
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
  }
}

TEST(SafetensorsLoad, ShardsThatAreNotRegularFilesAreRefused) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  std::filesystem::create_directory(dir / "sub.safetensors");
  std::filesystem::create_symlink("/dev/null", dir / "null.safetensors");
  EXPECT_EQ(load_errno_naming(dir / "null.safetensors", dir / "null.safetensors"), EINVAL);
  // An index that assigns tensors to a folder.
  nlohmann::json idx = {{"weight_map", {{"embed.weight", "sub.safetensors"}}}};
  std::ofstream(dir / "x.safetensors.index.json") << idx.dump();
  EXPECT_EQ(load_errno_naming(dir / "x.safetensors.index.json", dir / "sub.safetensors"), EISDIR);
}

TEST(SafetensorsLoad, IndexThatIsAFolderIsRefused) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  std::filesystem::create_directory(dir / "model.safetensors.index.json");
  EXPECT_EQ(load_errno_naming(dir.path(), dir / "model.safetensors.index.json"), EISDIR);
  EXPECT_EQ(load_errno_naming(dir / "model.safetensors.index.json", dir / "model.safetensors.index.json"), EISDIR);
}

TEST(SafetensorsLoad, FolderWithTwoIndexesIsRefused) {
  temp_dir dir;
  write_st(dir / "fp16-1.safetensors", {k_model[0]}, 1);
  write_st(dir / "fp32-1.safetensors", {k_model[0]}, 2);
  std::ofstream(dir / "m.fp16.safetensors.index.json") << R"({"weight_map":{"embed.weight":"fp16-1.safetensors"}})";
  std::ofstream(dir / "m.fp32.safetensors.index.json") << R"({"weight_map":{"embed.weight":"fp32-1.safetensors"}})";
  try {
    st::load(dir.path());
    FAIL() << "a folder with two indexes loaded";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("m.fp16.safetensors.index.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m.fp32.safetensors.index.json"), std::string::npos) << e.what();
  }
  // Each index alone loads its own shard.
  EXPECT_EQ(st::load(dir / "m.fp32.safetensors.index.json").tensors().at(0).file.filename(), "fp32-1.safetensors");
}

// Text from an index or a folder listing reaches messages escaped: a name or file name holding ESC, BEL, a C1
// control or a newline cannot drive the terminal that shows the error. The error's path() keeps the raw bytes
// (programs open it); only the message is escaped.
TEST(SafetensorsLoad, IndexTextInMessagesIsEscaped) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  const std::string key = "evil\x1b[2J\x07\n\xc2\x9bname";
  const auto idx = dir / "m.safetensors.index.json";
  struct hostile {
    std::string what;
    std::string text;
    int code;
  };
  const std::vector<hostile> cases = {
      {"value not a string", nlohmann::json{{"weight_map", {{key, 5}}}}.dump(), EBADMSG},
      {"leaves the folder", nlohmann::json{{"weight_map", {{key, "../a.safetensors"}}}}.dump(), EBADMSG},
      {"absolute", nlohmann::json{{"weight_map", {{key, "/a.safetensors"}}}}.dump(), EBADMSG},
      {"not in the header", nlohmann::json{{"weight_map", {{key, "a.safetensors"}}}}.dump(), EBADMSG},
      {"missing shard", nlohmann::json{{"weight_map", {{"w", "\x1b[31mgone\x07.safetensors"}}}}.dump(), ENOENT},
      {"syntax error", "{\"weight_map\": x\x1b\xc2\x9b[2J}", EBADMSG},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    gdskit::test::write_text(idx, c.text);
    try {
      st::load(idx);
      ADD_FAILURE() << "loaded";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), c.code) << e.what();
      const std::string what = e.what();
      for (char raw : {'\x1b', '\x07', '\n'}) EXPECT_EQ(what.find(raw), std::string::npos) << what;
      EXPECT_EQ(what.find("\xc2\x9b"), std::string::npos) << what;
      if (c.code == ENOENT) {
        EXPECT_NE(what.find("\\x1b[31mgone\\a.safetensors"), std::string::npos) << what;
        EXPECT_EQ(e.path(), (dir / "\x1b[31mgone\x07.safetensors").string());
      } else if (c.what != "syntax error") {
        EXPECT_NE(what.find("evil\\x1b[2J\\a\\n\\u009bname"), std::string::npos) << what;
      }
    }
  }
  // Index files found in a folder are named escaped too.
  std::filesystem::remove(idx);
  std::ofstream(dir / "a\x1b]0;x\x07.safetensors.index.json") << R"({"weight_map":{"embed.weight":"a.safetensors"}})";
  std::ofstream(dir / "b.safetensors.index.json") << R"({"weight_map":{"embed.weight":"a.safetensors"}})";
  try {
    st::load(dir.path());
    ADD_FAILURE() << "a folder with two indexes loaded";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(std::string(e.what()).find('\x1b'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a\\x1b]0;x\\a.safetensors.index.json"), std::string::npos) << e.what();
  }
}

// The allocation is sized by the bytes selected, not by how a file scatters them: runs are placed congruent to
// their file offset modulo a power of two no larger than themselves (4 KiB for runs that O_DIRECT can read into
// place), so a file of many one-byte tensors with gaps between them (read one by one when nothing is
// coalesced, as the distributed load asks) cannot make a 4 KiB allocation per byte.
TEST(SafetensorsLoad, AllocationIsBoundedByTheBytesSelected) {
  temp_dir dir;
  std::vector<spec> specs;
  const std::size_t n = 20000;
  for (std::size_t i = 0; i < n; ++i) {
    specs.push_back({fmt::format("t{:05d}", i), i % 3 == 0 ? "F16" : "U8", {1}, i % 3 == 0 ? 2u : 1u, 1});
  }
  auto w = write_st(dir / "scattered.safetensors", specs, 7);
  st::load_options o;
  o.coalesce_gap_bytes = 0;
  auto m = st::load(dir / "scattered.safetensors", o);
  ASSERT_EQ(m.tensors().size(), n);
  std::map<std::string, std::uint64_t> file_offset;
  for (const auto& t : st::read_header(dir / "scattered.safetensors").tensors) file_offset[t.name] = t.file_offset_bytes;
  std::uint64_t selected = 0, allocated = 0;
  for (const auto& t : m.tensors()) {
    selected += t.data.nbytes;
    EXPECT_EQ(view_bytes(t), w.bytes.at(t.name)) << t.name;
    // Elements stay as aligned in memory as they are in the file (the allocation is 4 KiB aligned).
    const auto address = reinterpret_cast<std::uintptr_t>(t.data.data);
    if (t.dtype == st::dtype::F16) EXPECT_EQ(address % 2, file_offset.at(t.name) % 2) << t.name;
  }
  for (const auto& a : m.allocations()) allocated += a.nbytes;
  EXPECT_LE(allocated, 3 * selected + 4096) << "selected " << selected;
}

// An index nested deeper than the documented bound is refused as malformed, however deep: nothing walks it.
TEST(SafetensorsLoad, IndexNestedBeyondTheBoundIsRefused) {
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  const auto idx = dir / "m.safetensors.index.json";
  auto nested = [](std::size_t depth) {
    return "{\"metadata\": {\"extra\": " + std::string(depth, '[') + std::string(depth, ']') +
           "}, \"weight_map\": {\"embed.weight\": \"a.safetensors\"}}";
  };
  // Within the bound (the object, "metadata", and 62 arrays): loads.
  gdskit::test::write_text(idx, nested(gdskit::max_index_json_depth - 2));
  EXPECT_EQ(st::load(idx).tensors().size(), 1u);
  for (std::size_t depth : {gdskit::max_index_json_depth - 1, std::size_t{1000000}}) {
    SCOPED_TRACE(depth);
    gdskit::test::write_text(idx, nested(depth));
    try {
      st::load(idx);
      ADD_FAILURE() << "loaded";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), EBADMSG);
      EXPECT_NE(std::string(e.what()).find("nested more than 64 levels"), std::string::npos) << e.what();
    }
  }
}

// A CUDA destination without a usable GPU is ENODEV with the reason, before the caller's allocate callback runs
// (a framework would raise its own error there) and before any file is opened.
TEST(SafetensorsLoad, DeviceWithoutAGpuIsEnodevBeforeAllocating) {
  std::string why;
  if (gdskit::gpu_available(&why)) GTEST_SKIP() << "a GPU is usable here";
  temp_dir dir;
  write_st(dir / "a.safetensors", {k_model[0]}, 1);
  st::load_options o;
  o.device = 0;
  bool called = false;
  o.allocate = [&](std::uint64_t) -> gdskit::buffer_view {
    called = true;
    throw std::runtime_error("the allocate callback ran");
  };
  for (const auto& p : {dir / "a.safetensors", dir / "missing.safetensors"}) {
    try {
      st::load(p, o);
      ADD_FAILURE() << "loaded";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), ENODEV) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(called);
}

}  // namespace
