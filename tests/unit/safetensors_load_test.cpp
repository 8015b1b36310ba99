// Loading safetensors into host memory: whole files, shards, subsets, tensor-parallel slices, caller buffers.
// Each result is compared with the bytes the test wrote. (GPU destinations: tests/gpu and
// scripts/gpu-safetensors-test.py.)
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/sha256.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"
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

// One pipeline across shards: random checkpoints of several files with unaligned tensors, read as segments
// small enough that every file boundary falls inside the pipeline; whole loads, subsets and tensor-parallel
// slices must stay byte-exact, and no more segments than the pipeline's depth may read at once.
TEST(SafetensorsLoad, CrossFilePipelineIsByteExactOnRandomShards) {
  std::mt19937_64 rng(77);
  for (int round = 0; round < 4; ++round) {
    temp_dir dir;
    const int nfiles = 2 + static_cast<int>(rng() % 4);
    std::map<std::string, std::vector<std::uint8_t>> all;
    std::map<std::string, std::vector<std::uint64_t>> shapes;
    nlohmann::json idx = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (int f = 0; f < nfiles; ++f) {
      std::vector<spec> specs;
      const int n = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) {
        const std::uint64_t rows = 1 + rng() % 700, cols = 1 + rng() % 300;
        specs.push_back({fmt::format("f{}.t{}", f, i), "BF16", {rows, cols}, 2,
                         static_cast<std::size_t>(rng() % 2 ? 0 : rng() % 200000)});
        shapes[specs.back().name] = {rows, cols};
      }
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, nfiles);
      auto w = write_st(dir / name, specs, rng());
      for (auto& [k, v] : w.bytes) {
        idx["weight_map"][k] = name;
        all[k] = v;
      }
    }
    std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
    st::load_options o;
    o.pipeline_segment_bytes = std::size_t{64} << 10;
    o.pipeline_depth = 1 + static_cast<unsigned>(round % 3);
    auto m = st::load(dir.path(), o);
    ASSERT_EQ(m.tensors().size(), all.size());
    for (const auto& t : m.tensors()) EXPECT_EQ(view_bytes(t), all.at(t.name)) << t.name;
    EXPECT_GE(m.stats().segments, static_cast<std::size_t>(nfiles));
    EXPECT_LE(m.stats().peak_segments_in_flight, o.pipeline_depth);  // how many overlap is timing; never more
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

}  // namespace
