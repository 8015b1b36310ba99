// The block store end to end on host memory: random blocks at odd sizes and unaligned rows read back equal,
// misses leave rows alone, capacity never exceeded on disk, S3-FIFO keeps reused blocks through a scan, pins,
// second-hit admission, namespaces never mixed, reopen (clean and from headers), corrupted blocks, headers and
// checkpoints served as misses with the rest intact, bad input refused before any I/O, futures, threads.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"
#include "gpu/cuda_raii.hpp"
#include "kv/format.hpp"
#include "kv/volume.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit::kv {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The content of key `k`'s block: a stream seeded by the key, so any row can be checked without keeping it.
std::vector<std::uint8_t> content(const key& k, std::size_t n, std::uint64_t salt = 0) {
  std::vector<std::uint8_t> out(n);
  std::uint64_t x = k.hash() ^ salt;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      x = z ^ (z >> 31);
    }
    out[i] = static_cast<std::uint8_t>(x >> (8 * (i % 8)));
  }
  return out;
}

std::vector<key> int_keys(std::int64_t first, std::size_t n) {
  std::vector<key> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(key::from_int(first + static_cast<std::int64_t>(i)));
  return out;
}

// Rows of `n` blocks in one buffer, `skew` bytes past an aligned start (so nothing is page aligned).
struct rows {
  rows(std::size_t n, std::size_t block, std::size_t skew = 3) : bytes(n * block + skew + 64, 0xAA), block_(block), skew_(skew) {}
  std::uint8_t* row(std::size_t i) { return bytes.data() + skew_ + i * block_; }
  std::vector<buffer_view> views(std::size_t n) {
    std::vector<buffer_view> v;
    for (std::size_t i = 0; i < n; ++i) v.push_back(buffer_view::host(row(i), block_));
    return v;
  }
  bool equals(std::size_t i, const std::vector<std::uint8_t>& want) { return std::memcmp(row(i), want.data(), block_) == 0; }
  bool untouched(std::size_t i) {
    return std::all_of(row(i), row(i) + block_, [](std::uint8_t b) { return b == 0xAA; });
  }
  std::vector<std::uint8_t> bytes;
  std::size_t block_, skew_;
};

class kv_store : public ::testing::Test {
 protected:
  store_options options(std::size_t block, std::uint64_t capacity, const std::string& ns = "model-a/fp16") {
    store_options o;
    o.paths = {dir_ / "store"};
    o.block_bytes = block;
    o.capacity_bytes = capacity;
    o.name_space = ns;
    o.deadline = 10s;
    return o;
  }
  // Capacity for `slots` blocks on one path.
  static std::uint64_t capacity_for(std::size_t block, std::uint64_t slots) {
    return gdskit::kv::capacity_for(slots, block);
  }
  op_result put_keys(block_store& s, const std::vector<key>& keys, std::size_t block) {
    rows r(keys.size(), block);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto c = content(keys[i], block);
      std::memcpy(r.row(i), c.data(), block);
    }
    const auto v = r.views(keys.size());
    return s.put(keys, v);
  }
  // A store of `keys`, made and closed (its folder stays).
  void stored_then_closed(std::size_t block, std::uint64_t capacity, const std::vector<key>& keys,
                          const std::string& ns = "model-a/fp16") {
    block_store s(options(block, capacity, ns));
    EXPECT_EQ(put_keys(s, keys, block).ok_count, keys.size());
  }
  // Gets every key and checks each hit's bytes; returns the hit count.
  std::size_t get_and_check(block_store& s, const std::vector<key>& keys, std::size_t block) {
    rows r(keys.size(), block);
    const auto v = r.views(keys.size());
    const op_result res = s.get(keys, v);
    std::size_t hits = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (res.ok[i]) {
        ++hits;
        EXPECT_TRUE(r.equals(i, content(keys[i], block))) << "wrong bytes for " << keys[i].to_string();
      } else {
        EXPECT_TRUE(r.untouched(i)) << "a miss wrote its row: " << keys[i].to_string();
      }
    }
    return hits;
  }
  // Gets every key: all hit with their bytes except keys[bad], a miss with `why` whose row is left alone.
  void expect_all_but(block_store& s, const std::vector<key>& keys, std::size_t block, std::size_t bad, std::errc why) {
    rows r(keys.size(), block);
    const op_result g = s.get(keys, r.views(keys.size()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i == bad) {
        EXPECT_FALSE(g.ok[i]);
        EXPECT_EQ(g.errors[i], why);
        EXPECT_TRUE(r.untouched(i));
      } else {
        EXPECT_TRUE(g.ok[i]) << i;
        EXPECT_TRUE(r.equals(i, content(keys[i], block))) << i;
      }
    }
  }
  std::uint64_t file_physical_bytes() {
    struct stat st {};
    if (::stat((dir_ / "store" / detail::data_file_name).c_str(), &st) != 0) return 0;
    return static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  test::temp_dir dir_;
};

TEST_F(kv_store, odd_block_size_unaligned_rows_round_trip) {
  const std::size_t block = 5000;
  block_store s(options(block, 64 << 20));
  std::vector<key> keys = int_keys(1, 40);
  keys.push_back(key::from_bytes(std::string_view("\x01\x02\x03", 3)));
  keys.push_back(key::from_int(-7));
  const op_result p = put_keys(s, keys, block);
  EXPECT_EQ(p.ok_count, keys.size());
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
  // Absent keys: misses with ENOENT, rows untouched.
  const std::vector<key> absent = {key::from_int(1000), key::from_bytes(std::string_view("\x01", 1)), key::from_int(7) };
  rows r(3, block);
  const auto v = r.views(3);
  const op_result g = s.get(absent, v);
  EXPECT_FALSE(g.ok[0]);
  EXPECT_EQ(g.errors[0], std::errc::no_such_file_or_directory);
  EXPECT_FALSE(g.ok[1]);
  EXPECT_TRUE(g.ok[2]);
  EXPECT_TRUE(r.untouched(0));
  EXPECT_TRUE(r.untouched(1));
  EXPECT_TRUE(r.equals(2, content(key::from_int(7), block)));
  const store_stats st = s.stats();
  EXPECT_EQ(st.stored, keys.size());
  EXPECT_EQ(st.checksum_failures, 0u);
}

TEST_F(kv_store, present_keys_are_not_written_again) {
  const std::size_t block = 4096;
  block_store s(options(block, 8 << 20));
  const std::vector<key> keys = {key::from_int(1), key::from_int(2), key::from_int(1)};
  const op_result p = put_keys(s, keys, block);
  EXPECT_EQ(p.ok_count, 3u);
  const op_result again = put_keys(s, {key::from_int(2)}, block);
  EXPECT_TRUE(again.ok[0]);
  const store_stats st = s.stats();
  EXPECT_EQ(st.stored, 2u);
  EXPECT_EQ(st.already_present, 2u);
}

TEST_F(kv_store, lookup_prefix_pin) {
  const std::size_t block = 4096;
  block_store s(options(block, 8 << 20));
  put_keys(s, int_keys(0, 5), block);
  std::vector<key> asked = int_keys(0, 8);
  std::swap(asked[5], asked[7]);  // 0..4 held, then 7 (absent), 6, 5
  const auto l = s.lookup(asked);
  EXPECT_EQ(std::count(l.begin(), l.end(), true), 5);
  EXPECT_EQ(s.prefix(asked), 5u);
  EXPECT_EQ(s.prefix(std::vector<key>{key::from_int(9), key::from_int(0)}), 0u);
  const auto pinned = s.pin(std::vector<key>{key::from_int(0), key::from_int(99)});
  EXPECT_TRUE(pinned[0]);
  EXPECT_FALSE(pinned[1]);
  EXPECT_EQ(s.stats().pinned, 1u);
  s.unpin(std::vector<key>{key::from_int(0), key::from_int(0), key::from_int(99)});
  EXPECT_EQ(s.stats().pinned, 0u);
}

TEST_F(kv_store, capacity_never_exceeded_and_recent_blocks_served) {
  const std::size_t block = 16384;
  const std::uint64_t capacity = capacity_for(block, 32);
  block_store s(options(block, capacity));
  EXPECT_EQ(s.stats().slots, 32u);
  std::uint64_t peak = 0;
  for (int round = 0; round < 25; ++round) {
    const op_result p = put_keys(s, int_keys(round * 20, 20), block);
    EXPECT_EQ(p.ok_count, 20u) << "round " << round << " " << (p.ok_count < 20 ? p.errors[19].message() : "");
    peak = std::max(peak, file_physical_bytes());
    const store_stats st = s.stats();
    EXPECT_LE(st.blocks, st.slots);
    EXPECT_LE(st.physical_bytes, capacity);
  }
  EXPECT_LE(peak, capacity) << "the data file grew past the capacity";
  EXPECT_GT(s.stats().evictions, 400u);
  // Every get of every key ever put is right or a miss; the last round is mostly still there.
  EXPECT_GT(get_and_check(s, int_keys(24 * 20, 20), block), 10u);
  get_and_check(s, int_keys(0, 500), block);
}

// Concurrent callers putting twice the capacity in random order write slots all over the file, so its data
// and headers leave written and unwritten runs everywhere: the file system's extent tree grows, and its blocks
// count too. The store keeps room for them: the file's physical size never passes the capacity.
TEST_F(kv_store, capacity_holds_with_the_file_systems_own_blocks) {
  const std::size_t block = 4096;
  const std::uint64_t slots = 3000;
  const std::uint64_t capacity = capacity_for(block, slots);
  block_store s(options(block, capacity));
  std::atomic<std::uint64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(77 + t);
      for (int call = 0; call < 2 * static_cast<int>(slots) / 4 / 24; ++call) {
        std::vector<key> keys;
        for (int i = 0; i < 24; ++i) keys.push_back(key::from_uint(rng()));
        put_keys(s, keys, block);
        std::uint64_t now = file_physical_bytes(), seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), capacity) << "the data file's blocks passed the capacity";
  EXPECT_LE(s.stats().physical_bytes, capacity);
  EXPECT_GT(s.stats().evictions, 0u);
}

TEST_F(kv_store, reused_blocks_survive_a_scan) {
  // S3-FIFO: blocks read after they were stored move to the main queue; a scan of blocks put once and never
  // read flows through the small queue without displacing them. (A FIFO or LRU would lose them all.)
  const std::size_t block = 4096;
  block_store s(options(block, capacity_for(block, 400)));
  const std::vector<key> hot = int_keys(0, 40);
  put_keys(s, hot, block);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(get_and_check(s, hot, block), hot.size());
  for (int i = 0; i < 20; ++i) put_keys(s, int_keys(10000 + i * 100, 100), block);  // 2000 once-only blocks
  EXPECT_EQ(get_and_check(s, hot, block), hot.size()) << "the scan pushed out the blocks being reused";
}

TEST_F(kv_store, pinned_blocks_are_never_evicted) {
  const std::size_t block = 4096;
  block_store s(options(block, capacity_for(block, 16)));
  const std::vector<key> keep = int_keys(0, 16);
  EXPECT_EQ(put_keys(s, keep, block).ok_count, 16u);
  const auto pinned = s.pin(keep);
  EXPECT_EQ(std::count(pinned.begin(), pinned.end(), true), 16);
  const op_result p = put_keys(s, int_keys(100, 4), block);
  EXPECT_EQ(p.ok_count, 0u);
  EXPECT_EQ(p.errors[0], std::errc::no_space_on_device);
  EXPECT_EQ(get_and_check(s, keep, block), 16u);
  s.unpin(std::vector<key>(keep.begin(), keep.begin() + 8));
  EXPECT_EQ(put_keys(s, int_keys(100, 4), block).ok_count, 4u);
  EXPECT_EQ(get_and_check(s, std::vector<key>(keep.begin() + 8, keep.end()), block), 8u);
}

TEST_F(kv_store, second_hit_admission) {
  const std::size_t block = 4096;
  store_options o = options(block, 8 << 20);
  o.admit = admission::second_hit;
  block_store s(o);
  const op_result first = put_keys(s, {key::from_int(5)}, block);
  EXPECT_FALSE(first.ok[0]);
  EXPECT_EQ(first.errors[0], std::errc::resource_unavailable_try_again);
  EXPECT_FALSE(s.lookup(std::vector<key>{key::from_int(5)})[0]);
  EXPECT_TRUE(put_keys(s, {key::from_int(5)}, block).ok[0]);
  EXPECT_EQ(get_and_check(s, {key::from_int(5)}, block), 1u);
  EXPECT_EQ(s.stats().not_admitted, 1u);
}

TEST_F(kv_store, reopen_after_close_reads_only_the_checkpoint) {
  const std::size_t block = 8192;
  const std::vector<key> keys = int_keys(0, 60);
  {
    block_store s(options(block, 16 << 20));
    put_keys(s, keys, block);
    EXPECT_TRUE(s.stats().recovery.created);
  }
  block_store s(options(block, 16 << 20));
  const recovery_info r = s.stats().recovery;
  EXPECT_FALSE(r.created);
  EXPECT_TRUE(r.from_checkpoint);
  EXPECT_TRUE(r.clean);
  EXPECT_EQ(r.headers_read, 0u);
  EXPECT_EQ(r.blocks, keys.size());
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
}

// Byte offset of the slot holding `k`, found by reading the headers (as a recovery would).
std::optional<std::uint64_t> slot_of(const fs::path& data, std::size_t block, std::uint64_t slots, const key& k) {
  const detail::layout l = detail::make_layout(block, slots);
  const auto bytes = test::read_file(data);
  for (std::uint64_t s = 0; s < slots; ++s) {
    const std::uint64_t at = l.header_position(s);
    if (at + detail::page_bytes > bytes.size()) break;
    detail::block_header h;
    if (detail::decode_header(bytes.data() + at, h) && h.k == k) return l.slot_position(s);
  }
  return std::nullopt;
}

void patch_file(const fs::path& p, std::uint64_t offset, std::uint8_t x) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ x);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// A block whose data is damaged on disk is a miss (EBADMSG) and its row is left alone: the bytes are checked in
// the transfer core's staging before any reaches the row. A damaged header is found where headers are read (the
// index rebuild): its block is then not held; the index of a clean close does not read it, and the block's data,
// still checked against the CRC the index holds, is served.
TEST_F(kv_store, corrupted_data_and_header_are_misses_and_the_rest_is_served) {
  const std::size_t block = 8192;
  const std::uint64_t slots = 64;
  const std::vector<key> keys = int_keys(0, 30);
  stored_then_closed(block, capacity_for(block, slots), keys);
  const fs::path data = dir_ / "store" / detail::data_file_name;
  const auto a = slot_of(data, block, slots, keys[3]);
  const auto b = slot_of(data, block, slots, keys[17]);
  ASSERT_TRUE(a && b);
  patch_file(data, *a + 1234, 0x01);                                   // one bit of the data
  patch_file(data, *b + detail::round_up(block, 4096) + 50, 0x80);     // one bit of the header
  {
    block_store s(options(block, capacity_for(block, slots)));
    EXPECT_TRUE(s.lookup(std::vector<key>{keys[3]})[0]);  // the index (a checkpoint) still lists it ...
    expect_all_but(s, keys, block, 3, std::errc::bad_message);
    EXPECT_EQ(s.stats().checksum_failures, 1u);
    EXPECT_FALSE(s.lookup(std::vector<key>{keys[3]})[0]);  // ... until a read finds it bad
    // Its slot is used again.
    EXPECT_EQ(put_keys(s, {keys[3]}, block).ok_count, 1u);
    EXPECT_EQ(get_and_check(s, {keys[3]}, block), 1u);
  }
  // Rebuilt from the headers: the damaged one is skipped, its key not held; everything else is served.
  store_options o = options(block, capacity_for(block, slots));
  o.ignore_checkpoint = true;
  block_store s(o);
  EXPECT_EQ(s.stats().recovery.bad_headers, 1u);
  EXPECT_FALSE(s.lookup(std::vector<key>{keys[17]})[0]);
  expect_all_but(s, keys, block, 17, std::errc::no_such_file_or_directory);
}

TEST_F(kv_store, damaged_checkpoints_fall_back_to_the_headers) {
  const std::size_t block = 4096;
  const std::uint64_t slots = 50;
  const std::vector<key> keys = int_keys(500, 40);
  stored_then_closed(block, capacity_for(block, slots), keys);
  const fs::path data = dir_ / "store" / detail::data_file_name;
  const detail::layout l = detail::make_layout(block, slots);
  patch_file(data, l.checkpoint_position(0) + detail::page_bytes + 10, 0x04);  // bodies: their CRCs fail
  patch_file(data, l.checkpoint_position(1) + detail::page_bytes + 10, 0x04);
  block_store s(options(block, capacity_for(block, slots)));
  const recovery_info r = s.stats().recovery;
  EXPECT_FALSE(r.from_checkpoint);
  EXPECT_EQ(r.headers_read, slots);
  EXPECT_EQ(r.blocks, keys.size());
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
}

TEST_F(kv_store, full_header_scan_on_request) {
  const std::size_t block = 4096;
  const std::vector<key> keys = int_keys(0, 20);
  stored_then_closed(block, capacity_for(block, 30), keys);
  store_options o = options(block, capacity_for(block, 30));
  o.ignore_checkpoint = true;
  block_store s(o);
  EXPECT_EQ(s.stats().recovery.headers_read, 30u);
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
}

TEST_F(kv_store, namespaces_never_mix) {
  const std::size_t block = 4096;
  const std::vector<key> keys = int_keys(0, 10);
  stored_then_closed(block, 8 << 20, keys, "rev-1");
  try {
    block_store other(options(block, 8 << 20, "rev-2"));
    FAIL() << "a store of another namespace was opened";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::file_exists);
  }
  // Even when the superblock is rewritten to claim the other namespace, no block of rev-1 is served: every
  // block header names its namespace.
  const fs::path data = dir_ / "store" / detail::data_file_name;
  auto bytes = test::read_file(data);
  detail::superblock sb;
  ASSERT_EQ(detail::decode_superblock(std::span<const std::uint8_t, detail::page_bytes>(bytes.data(), detail::page_bytes), sb),
            detail::page_kind::ok);
  sb.name_space = "rev-2";
  sb.namespace_hash = detail::namespace_hash(sb.name_space);
  detail::encode_superblock(sb, std::span<std::uint8_t, detail::page_bytes>(bytes.data(), detail::page_bytes));
  test::write_file(data, bytes);
  block_store s(options(block, 8 << 20, "rev-2"));
  EXPECT_EQ(get_and_check(s, keys, block), 0u);
}

TEST_F(kv_store, mismatched_store_is_refused_and_left_alone) {
  const std::size_t block = 4096;
  { block_store s(options(block, 8 << 20)); put_keys(s, int_keys(0, 5), block); }
  const fs::path data = dir_ / "store" / detail::data_file_name;
  const auto before = test::read_file(data);
  for (auto [b, cap] : {std::pair<std::size_t, std::uint64_t>{8192, 8 << 20}, {4096, 16 << 20}}) {
    try {
      block_store s(options(b, cap));
      FAIL() << "opened with block " << b << " capacity " << cap;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::file_exists);
      EXPECT_EQ(e.path(), data.string());
    }
  }
  EXPECT_EQ(test::read_file(data), before);
}

TEST_F(kv_store, second_writer_is_refused) {
  block_store s(options(4096, 8 << 20));
  try {
    block_store t(options(4096, 8 << 20));
    FAIL() << "two writers on one store";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::device_or_resource_busy);
    EXPECT_NE(std::string(e.what()).find("already open in this process"), std::string::npos) << e.what();
  }
  s.close();
  block_store t(options(4096, 8 << 20));  // the lock went with close
}

TEST_F(kv_store, bad_input_is_refused_before_any_io) {
  auto code_of = [](auto&& fn) -> std::error_code {
    try {
      fn();
    } catch (const error& e) {
      return e.code();
    }
    return {};
  };
  // Options.
  store_options o = options(4096, 8 << 20);
  o.paths.clear();
  EXPECT_EQ(code_of([&] { block_store s(o); }), std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { block_store s(options(0, 8 << 20)); }), std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { block_store s(options(4096, 4096)); }), std::errc::invalid_argument);  // below one block
  // More than a file can hold: refused at once (the layout's sums would overflow; this once looped for good).
  EXPECT_EQ(code_of([&] { block_store s(options(4096, ~std::uint64_t{0})); }), std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { block_store s(options(65536, std::uint64_t{1} << 62)); }), std::errc::invalid_argument);
  EXPECT_GT(detail::slots_within(65536, ~std::uint64_t{0}), 0u);  // the count alone is bounded, never wraps
  EXPECT_EQ(code_of([&] { block_store s(options(4096, 8 << 20, std::string(2000, 'x'))); }), std::errc::invalid_argument);
  o = options(4096, 8 << 20);
  o.deadline = 0s;
  EXPECT_EQ(code_of([&] { block_store s(o); }), std::errc::invalid_argument);
  o = options(4096, 8 << 20);
  o.paths.push_back(o.paths.front());
  EXPECT_EQ(code_of([&] { block_store s(o); }), std::errc::invalid_argument);
  test::write_text(dir_ / "afile", "not a folder");
  o = options(4096, 8 << 20);
  o.paths = {dir_ / "afile"};
  EXPECT_EQ(code_of([&] { block_store s(o); }), std::errc::not_a_directory);
  EXPECT_FALSE(fs::exists(dir_ / "store")) << "a refused open created something";

  // Calls.
  block_store s(options(4096, 8 << 20));
  rows r(3, 4096);
  auto v = r.views(3);
  const std::vector<key> two = int_keys(0, 2);
  EXPECT_EQ(code_of([&] { s.put(two, v); }), std::errc::invalid_argument);  // 2 keys, 3 rows
  std::vector<key> with_empty = int_keys(0, 3);
  with_empty[1] = key{};
  EXPECT_EQ(code_of([&] { s.put(with_empty, v); }), std::errc::invalid_argument);
  auto short_rows = v;
  short_rows[2].nbytes = 4095;
  EXPECT_EQ(code_of([&] { s.put(int_keys(0, 3), short_rows); }), std::errc::invalid_argument);
  auto overlapping = v;
  overlapping[2].data = r.row(1) + 100;
  EXPECT_EQ(code_of([&] { s.get(int_keys(0, 3), overlapping); }), std::errc::invalid_argument);
  auto null_row = v;
  null_row[0].data = nullptr;
  EXPECT_EQ(code_of([&] { s.get(int_keys(0, 3), null_row); }), std::errc::bad_address);
  auto gpu_row = v;
  gpu_row[0].kind = memory_kind::device;
  gpu_row[0].device = 0;
  if (!gpu_available()) EXPECT_EQ(code_of([&] { s.get(int_keys(0, 3), gpu_row); }), std::errc::no_such_device);
  const store_stats st = s.stats();
  EXPECT_EQ(st.puts + st.gets, 0u) << "a refused call counted keys";
  s.close();
  EXPECT_EQ(code_of([&] { s.lookup(two); }), std::errc::bad_file_descriptor);
}

TEST_F(kv_store, a_disk_too_small_is_refused_at_open_and_nothing_is_left) {
  posix::syscall_table t = posix::real_syscalls();
  t.fallocate = [](int, int, off_t, off_t) -> int {
    errno = ENOSPC;
    return -1;
  };
  {
    posix::scoped_syscalls full(t);
    try {
      block_store s(options(4096, 8 << 20));
      FAIL() << "a store was made on a full disk";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::no_space_on_device);
    }
  }
  EXPECT_FALSE(fs::exists(dir_ / "store" / detail::data_file_name));
  EXPECT_FALSE(fs::exists(dir_ / "store" / (std::string(detail::data_file_name) + ".tmp")));
  store_options sparse = options(4096, 8 << 20);
  sparse.preallocate = false;
  block_store s(sparse);
  EXPECT_LT(s.stats().physical_bytes, std::uint64_t{1} << 20);  // grows as blocks are written
  EXPECT_EQ(put_keys(s, int_keys(0, 4), 4096).ok_count, 4u);
}

// A read-only file system (acted out through the syscall seam: every open for writing fails with EROFS, as the
// kernel answers there; permissions do not stop root) is refused at open with its errno and the path, for an
// existing store and for a new one, and an existing store's files are left as they were.
TEST_F(kv_store, a_read_only_file_system_is_refused_at_open_and_nothing_changes) {
  {
    block_store s(options(4096, 8 << 20));
    ASSERT_EQ(put_keys(s, int_keys(0, 4), 4096).ok_count, 4u);
  }
  const fs::path data = dir_ / "store" / detail::data_file_name;
  const auto before = test::read_file(data);
  posix::syscall_table t = posix::real_syscalls();
  t.open = [](const char* path, int flags, mode_t mode) -> int {
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT) != 0) {
      errno = EROFS;
      return -1;
    }
    return posix::real_syscalls().open(path, flags, mode);
  };
  {
    posix::scoped_syscalls read_only(t);
    for (const fs::path& where : {dir_ / "store", dir_ / "other"}) {
      store_options o = options(4096, 8 << 20);
      o.paths = {where};
      fs::create_directories(where);
      try {
        block_store s(o);
        ADD_FAILURE() << where << ": opened on a read-only file system";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), std::errc::read_only_file_system) << e.what();
        EXPECT_NE(std::string(e.what()).find(where.string()), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(test::read_file(data), before);
  EXPECT_TRUE(fs::is_empty(dir_ / "other"));
  block_store s(options(4096, 8 << 20));  // writable again: the blocks are all there
  EXPECT_EQ(get_and_check(s, int_keys(0, 4), 4096), 4u);
}

TEST_F(kv_store, foreign_or_damaged_files_are_left_alone) {
  fs::create_directories(dir_ / "store");
  const fs::path data = dir_ / "store" / detail::data_file_name;
  test::write_text(data, std::string(8192, 'z'));
  try {
    block_store s(options(4096, 8 << 20));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::bad_message);
  }
  EXPECT_EQ(test::read_file(data).size(), 8192u);
  fs::remove(data);
  fs::create_symlink("/etc/hostname", data);
  try {
    block_store s(options(4096, 8 << 20));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
}

TEST_F(kv_store, tmpfs_works_without_o_direct_and_says_so) {
  // On /dev/shm (tmpfs). Kernels before 6.6 refuse O_DIRECT there; on newer ones the refusal is acted out
  // through the syscall seam, as those kernels answer (EINVAL).
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  test::temp_dir tmp("/dev/shm");
  posix::syscall_table t = posix::real_syscalls();
  t.open = [](const char* path, int flags, mode_t mode) -> int {
    if ((flags & O_DIRECT) != 0) {
      errno = EINVAL;
      return -1;
    }
    return posix::real_syscalls().open(path, flags, mode);
  };
  posix::scoped_syscalls refuse(t);
  store_options o = options(4096, 8 << 20);
  o.paths = {tmp.path() / "store"};
  block_store s(o);
  const std::vector<key> keys = int_keys(0, 10);
  EXPECT_EQ(put_keys(s, keys, 4096).ok_count, 10u);
  EXPECT_EQ(get_and_check(s, keys, 4096), 10u);
  const store_stats st = s.stats();
  EXPECT_FALSE(st.direct);
  EXPECT_NE(st.direct_reason.find("refuses O_DIRECT"), std::string::npos) << st.direct_reason;
  bool said = false;
  for (const auto& r : st.path_reasons) said = said || r.find("page cache") != std::string::npos;
  EXPECT_TRUE(said);
  s.close();
}

TEST_F(kv_store, several_paths_striped_and_reopened_in_any_order) {
  store_options o = options(4096, 2 * capacity_for(4096, 40));
  o.paths = {dir_ / "a", dir_ / "b"};
  const std::vector<key> keys = int_keys(0, 60);
  {
    block_store s(o);
    EXPECT_EQ(s.stats().slots, 80u);
    put_keys(s, keys, 4096);
  }
  EXPECT_TRUE(fs::exists(dir_ / "a" / detail::data_file_name));
  EXPECT_TRUE(fs::exists(dir_ / "b" / detail::data_file_name));
  std::swap(o.paths[0], o.paths[1]);
  {
    block_store s(o);
    EXPECT_EQ(get_and_check(s, keys, 4096), keys.size());
  }
  o.paths = {dir_ / "a", dir_ / "c"};
  EXPECT_THROW(block_store s(o), error);  // half a store
}

// A store on a whole block device (a loop device over a file here): made on a blank device, reopened, and a
// device holding something else refused untouched.
TEST_F(kv_store, block_device_store) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a loop device";
  const fs::path img = dir_ / "disk.img";
  test::write_file(img, std::vector<std::uint8_t>(16 << 20, 0));
  std::string dev;
  {
    const std::string cmd = "losetup -f --show " + img.string() + " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) GTEST_SKIP() << "no losetup";
    char line[256] = {};
    if (std::fgets(line, sizeof line, p) != nullptr) dev = line;
    ::pclose(p);
    while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
  }
  if (dev.empty()) GTEST_SKIP() << "no free loop device (losetup -f failed)";
  struct detach {
    std::string dev;
    ~detach() { (void)std::system(("losetup -d " + dev + " 2>/dev/null").c_str()); }
  } cleanup{dev};
  store_options o = options(8192, 64 << 20);
  o.paths = {dev};
  try {
    block_store s(o);  // a 16 MiB device cannot hold 64 MiB
    FAIL() << "a store larger than its device was made";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
  o.capacity_bytes = 12 << 20;
  const std::vector<key> keys = int_keys(0, 40);
  {
    block_store s(o);
    EXPECT_EQ(put_keys(s, keys, 8192).ok_count, keys.size());
    EXPECT_LE(s.stats().physical_bytes, o.capacity_bytes);
  }
  {
    block_store s(o);
    EXPECT_TRUE(s.stats().recovery.clean);
    EXPECT_EQ(get_and_check(s, keys, 8192), keys.size());
  }
  // Something else on the device: refused, and left as it was.
  {
    std::fstream f(dev, std::ios::in | std::ios::out | std::ios::binary);
    f.write("\x7f" "ELF not a store", 16);
  }
  try {
    block_store s(o);
    FAIL() << "a device holding something else was used";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::bad_message);
  }
}

TEST_F(kv_store, persist_mode_round_trip) {
  store_options o = options(8192, 8 << 20);
  o.mode = durability::persist;
  const std::vector<key> keys = int_keys(0, 12);
  {
    block_store s(o);
    EXPECT_EQ(put_keys(s, keys, 8192).ok_count, keys.size());
  }
  block_store s(o);
  EXPECT_EQ(get_and_check(s, keys, 8192), keys.size());
}

TEST_F(kv_store, futures_complete_by_fd_and_cancel_changes_nothing_after_the_end) {
  block_store s(options(4096, 8 << 20));
  const std::vector<key> keys = int_keys(0, 16);
  rows in(16, 4096);
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(in.row(i), content(keys[i], 4096).data(), 4096);
  auto iv = in.views(16);
  op_future put = s.submit_put(keys, iv);
  pollfd p{put.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  EXPECT_TRUE(put.ready());
  EXPECT_EQ(put.get().ok_count, 16u);
  EXPECT_FALSE(put.cancel());
  rows out(16, 4096);
  auto ov = out.views(16);
  op_future get = s.submit_get(keys, ov);
  EXPECT_TRUE(get.wait_for(10s));
  EXPECT_TRUE(get.released());
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(out.equals(i, content(keys[i], 4096)));
  op_future empty;
  EXPECT_THROW(empty.ready(), error);
}

// capacity_for is exact: that capacity holds the blocks, one byte less does not (per path, for several paths).
TEST_F(kv_store, capacity_for_holds_exactly_that_many_blocks) {
  for (const std::size_t block : {std::size_t{1}, std::size_t{4096}, std::size_t{65536 + 5}}) {
    for (const std::uint64_t n : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{100}}) {
      for (const std::size_t paths : {std::size_t{1}, std::size_t{3}}) {
        const std::uint64_t need = gdskit::kv::capacity_for(n, block, paths);
        const std::uint64_t per_path = (n + paths - 1) / paths;
        EXPECT_EQ(detail::slots_within(block, need / paths), per_path) << block << " " << n << " " << paths;
        EXPECT_LT(detail::slots_within(block, (need - 1) / paths), per_path) << block << " " << n << " " << paths;
      }
    }
  }
  EXPECT_THROW(gdskit::kv::capacity_for(1, 0), error);
  EXPECT_THROW(gdskit::kv::capacity_for(1, 4096, 0), error);
  block_store s(options(8192, gdskit::kv::capacity_for(12, 8192)));
  EXPECT_EQ(s.stats().slots, 12u);
}

// Blocks larger than one checked range of the transfer core (8 MiB) are written in pieces whose sums combine
// into the block's, and read through the store's memory: right bytes, unaligned rows, a damaged piece a miss
// that leaves its row alone, and the same through submit_get.
TEST_F(kv_store, blocks_over_8_mib_round_trip_and_are_checked) {
  const std::size_t block = (std::size_t{8} << 20) + 12288 + 5;
  const std::vector<key> keys = int_keys(40, 3);
  block_store s(options(block, gdskit::kv::capacity_for(4, block)));
  ASSERT_EQ(put_keys(s, keys, block).ok_count, 3u);
  EXPECT_EQ(get_and_check(s, keys, block), 3u);
  rows r(3, block);
  op_future f = s.submit_get(keys, r.views(3));
  pollfd p{f.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  EXPECT_EQ(f.get().ok_count, 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(r.equals(i, content(keys[i], block))) << i;
  s.close();
  const fs::path data = dir_ / "store" / detail::data_file_name;
  const auto at = slot_of(data, block, 4, keys[1]);
  ASSERT_TRUE(at);
  patch_file(data, *at + (std::size_t{8} << 20) + 100, 0x04);  // in the second piece
  block_store again(options(block, gdskit::kv::capacity_for(4, block)));
  rows back(3, block);
  const op_result g = again.get(keys, back.views(3));
  EXPECT_TRUE(g.ok[0] && g.ok[2]);
  EXPECT_FALSE(g.ok[1]);
  EXPECT_EQ(g.errors[1], std::errc::bad_message);
  EXPECT_TRUE(back.untouched(1));
  EXPECT_TRUE(back.equals(0, content(keys[0], block)) && back.equals(2, content(keys[2], block)));
  // Read side by side (the next blocks while one is checked), a key never held and the damaged block (which
  // left the index when it failed its check) between held ones change nothing for the others, and their rows
  // stay untouched.
  const std::vector<key> mixed = {keys[2], gdskit::kv::key::from_int(999), keys[1], keys[0]};
  rows m(4, block);
  const op_result h = again.get(mixed, m.views(4));
  EXPECT_EQ(h.ok, (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(h.errors[1], std::errc::no_such_file_or_directory);
  EXPECT_EQ(h.errors[2], std::errc::no_such_file_or_directory);
  EXPECT_TRUE(m.untouched(1) && m.untouched(2));
  EXPECT_TRUE(m.equals(0, content(keys[2], block)) && m.equals(3, content(keys[0], block)));
}

// A submitted get is the transfer core's batch: its descriptor becomes readable when the bytes have landed,
// and the store settles the keys (hits, index) at its next call even when nobody asks the future.
TEST_F(kv_store, a_submitted_get_is_settled_without_being_asked) {
  const std::size_t block = 16384;
  block_store s(options(block, 8 << 20));
  const std::vector<key> keys = int_keys(0, 20);
  ASSERT_EQ(put_keys(s, keys, block).ok_count, 20u);
  std::vector<key> asked = keys;
  asked.push_back(key::from_int(-5));  // not held
  rows r(asked.size(), block);
  op_future f = s.submit_get(asked, r.views(asked.size()));
  pollfd p{f.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  // A readable descriptor says the future is ready; the future (not the descriptor) is what orders the rows'
  // bytes before this thread reads them.
  ASSERT_TRUE(f.ready());
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(r.equals(i, content(keys[i], block))) << i;
  EXPECT_TRUE(r.untouched(keys.size()));
  const store_stats st = s.stats();  // settles the get
  EXPECT_EQ(st.hits, 20u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_TRUE(f.ready() && f.released());
  EXPECT_FALSE(f.cancel());
  EXPECT_EQ(f.get().ok_count, 20u);
  EXPECT_EQ(f.get().errors.back(), std::errc::no_such_file_or_directory);
  // Nothing held: ready at once, with a descriptor of its own.
  rows none(2, block);
  op_future g = s.submit_get(int_keys(1000, 2), none.views(2));
  EXPECT_TRUE(g.ready());
  pollfd q{g.fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&q, 1, 0), 1);
  EXPECT_EQ(g.get().ok_count, 0u);
  // Cancelled before it ran: the keys not read are ECANCELED misses, rows untouched.
  rows c(keys.size(), block);
  op_options past;
  op_future h = s.submit_get(keys, c.views(keys.size()));
  h.cancel();
  const op_result& hr = h.get();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (hr.ok[i]) {
      EXPECT_TRUE(c.equals(i, content(keys[i], block)));
    } else {
      EXPECT_EQ(hr.errors[i], std::errc::operation_canceled);
      EXPECT_TRUE(c.untouched(i));
    }
  }
  // A deadline already past: every key a timed-out miss, and the store keeps serving.
  past.deadline = std::chrono::steady_clock::now() - 1ms;
  const op_result late = s.get(keys, c.views(keys.size()), past);
  EXPECT_EQ(late.ok_count, 0u);
  EXPECT_EQ(late.errors[0], std::errc::timed_out);
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
}

// A submitted get's seconds end when its blocks were read, not when the caller came back for the outcome.
TEST_F(kv_store, a_get_looked_at_late_reports_when_it_ended) {
  const std::size_t block = 16384;
  block_store s(options(block, 8 << 20));
  const std::vector<key> keys = int_keys(0, 8);
  ASSERT_EQ(put_keys(s, keys, block).ok_count, keys.size());
  rows r(keys.size(), block);
  const auto t0 = std::chrono::steady_clock::now();
  op_future f = s.submit_get(keys, r.views(keys.size()));
  pollfd p{f.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  const double readable = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(200ms);
  const op_result& res = f.get();
  EXPECT_EQ(res.ok_count, keys.size());
  EXPECT_GT(res.seconds, 0.0);
  EXPECT_LE(res.seconds, readable);
}

// The blocks of `keys` in GPU memory (`in`, views of src) and rows of GPU memory to get them into (`out`).
struct gpu_rows {
  gpu_rows(const std::vector<key>& keys, std::size_t block) : src(keys.size() * block), dst(keys.size() * block) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      src.copy_from_host(content(keys[i], block).data(), block, i * block);
      in.push_back(src.view().sub(i * block, block));
      out.push_back(dst.view().sub(i * block, block));
    }
  }
  device_buffer src, dst;
  std::vector<buffer_view> in, out;
};

// GPU memory: puts from and gets into device memory, checked through host copies; skips without a GPU.
TEST_F(kv_store, gpu_memory_round_trip) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  const std::size_t block = 65536;
  block_store s(options(block, 32 << 20));
  EXPECT_EQ(s.stats().path, data_path::staged);
  const std::vector<key> keys = int_keys(0, 12);
  gpu_rows mem(keys, block);
  device_buffer& dst = mem.dst;
  const std::vector<buffer_view>& in = mem.in;
  std::vector<buffer_view>& out = mem.out;
  dst.fill(0xAA);
  EXPECT_EQ(s.put(keys, in).ok_count, keys.size());
  std::vector<key> asked = keys;
  asked.back() = key::from_int(999);  // a miss: its row stays as it was
  const op_result g = s.get(asked, out);
  EXPECT_EQ(g.ok_count, keys.size() - 1);
  std::vector<std::uint8_t> row(block);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    dst.copy_to_host(row.data(), block, i * block);
    if (i + 1 < keys.size()) {
      EXPECT_EQ(row, content(keys[i], block)) << i;
    } else {
      EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](std::uint8_t b) { return b == 0xAA; }));
    }
  }
  // Host rows read blocks put from GPU memory.
  EXPECT_EQ(get_and_check(s, std::vector<key>(keys.begin(), keys.end() - 1), block), keys.size() - 1);

  // Stream ordering: a copy queued on the stream right after submit_get (the host never waits for the get)
  // sees every block.
  const std::vector<key> held(keys.begin(), keys.end() - 1);
  dst.fill(0);
  gpu::cuda_stream stream(0, shim::CU_STREAM_NON_BLOCKING);
  op_options on_stream;
  on_stream.stream = stream.get();
  op_future f = s.submit_get(held, std::span<const buffer_view>(out.data(), held.size()), on_stream);
  pinned_buffer seen(held.size() * block);
  {
    gpu::context_guard ctx(0);
    const shim::cuda_api& api = shim::cuda_or_throw();
    shim::check_cuda(api.cuMemcpyDtoHAsync(seen.data(), reinterpret_cast<shim::CUdeviceptr>(dst.data()),
                                           held.size() * block, stream.get()),
                     "cuMemcpyDtoHAsync");
    shim::check_cuda(api.cuStreamSynchronize(stream.get()), "cuStreamSynchronize");
  }
  for (std::size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(std::memcmp(static_cast<const std::uint8_t*>(seen.data()) + i * block, content(held[i], block).data(),
                          block),
              0)
        << "work on the stream ran before block " << i << " landed";
  }
  EXPECT_EQ(f.get().ok_count, held.size());
}

// GPU memory with blocks over 8 MiB (pieces on the way out, the store's memory on the way in).
TEST_F(kv_store, gpu_memory_large_blocks) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  const std::size_t block = (std::size_t{12} << 20) + 4096;
  const std::vector<key> keys = int_keys(0, 3);
  block_store s(options(block, gdskit::kv::capacity_for(4, block)));
  gpu_rows g(keys, block);
  EXPECT_EQ(s.put(keys, g.in).ok_count, keys.size());
  EXPECT_EQ(s.get(keys, g.out).ok_count, keys.size());
  std::vector<std::uint8_t> row(block);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    g.dst.copy_to_host(row.data(), block, i * block);
    EXPECT_EQ(row, content(keys[i], block)) << i;
  }
  EXPECT_EQ(get_and_check(s, keys, block), keys.size());
}

TEST_F(kv_store, threads_share_a_store) {
  const std::size_t block = 4096;
  block_store s(options(block, capacity_for(block, 200)));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < 40; ++round) {
        std::vector<key> keys;
        for (int i = 0; i < 8; ++i) keys.push_back(key::from_int(static_cast<std::int64_t>(rng() % 300)));
        std::sort(keys.begin(), keys.end(), [](const key& a, const key& b) { return a.hash() < b.hash(); });
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        rows r(keys.size(), block);
        if (round % 2 == 0) {
          for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(r.row(i), content(keys[i], block).data(), block);
          s.put(keys, r.views(keys.size()));
        } else {
          const op_result g = s.get(keys, r.views(keys.size()));
          for (std::size_t i = 0; i < keys.size(); ++i) {
            if (g.ok[i] && !r.equals(i, content(keys[i], block))) ++wrong;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(s.stats().blocks, 200u);
}

}  // namespace
}  // namespace gdskit::kv
