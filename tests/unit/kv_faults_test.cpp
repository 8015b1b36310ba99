// Faults through the syscall seam, on both I/O engines: ENOSPC and EIO make their keys fail (puts false, gets
// misses) while the store keeps serving; a slow device makes operations end at their deadline with nothing
// landing in the caller's rows afterwards; a torn write is never served.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"
#include "kv/format.hpp"
#include "kv/volume.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit::kv {
namespace {

using namespace std::chrono_literals;
using posix::real_syscalls;
using posix::scoped_syscalls;
using posix::syscall_table;

constexpr std::size_t block = 8192;

std::vector<std::uint8_t> content(const key& k) {
  std::vector<std::uint8_t> out = test::random_bytes(block, k.hash());
  return out;
}

std::vector<key> keys_from(std::int64_t first, std::size_t n) {
  std::vector<key> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(key::from_int(first + static_cast<std::int64_t>(i)));
  return out;
}

// What the injected calls do to I/O on the store's data file (other files pass through).
enum class fault { none, enospc_writes, eio_reads, slow_reads, slow_writes, torn_writes };

class kv_faults : public ::testing::TestWithParam<engine_kind> {
 protected:
  void SetUp() override {
    if (GetParam() == engine_kind::io_uring && !io_uring_unavailable_reason().empty()) {
      GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
    }
    o_.paths = {dir_ / "store"};
    o_.block_bytes = block;
    o_.capacity_bytes = detail::make_layout(block, 64).end_bytes;
    o_.name_space = "faults";
    o_.deadline = 5s;
    o_.staging_bytes = 1 << 20;
    o_.io.engine = GetParam();
    store_ = std::make_unique<block_store>(o_);
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / "store" / detail::data_file_name).c_str(), &st), 0);
    inode_ = st.st_ino;
  }
  void TearDown() override {
    // The seam's table may only change while nothing runs through it: wait for late requests to end.
    if (store_) {
      for (int i = 0; i < 2000 && store_->stats().quarantined != 0; ++i) std::this_thread::sleep_for(10ms);
    }
    seam_.reset();
    store_.reset();
  }

  bool ours(int fd) const {
    struct stat st {};
    return real_syscalls().fstat(fd, &st) == 0 && st.st_ino == inode_;
  }
  // Installs `f` for the data file's reads and writes, through both engines' entries.
  void inject(fault f, std::chrono::milliseconds delay = 0ms) {
    fault_ = f;
    delay_ = delay;
    syscall_table t = real_syscalls();
    t.pwrite = [this](int fd, const void* b, std::size_t n, off_t off) -> ssize_t {
      if (ours(fd)) {
        switch (fault_.load()) {
          case fault::enospc_writes: errno = ENOSPC; return -1;
          case fault::slow_writes: std::this_thread::sleep_for(delay_); break;
          case fault::torn_writes:
            if (n > 1) {
              real_syscalls().pwrite(fd, b, n / 2, off);
              errno = EIO;
              return -1;
            }
            break;
          default: break;
        }
      }
      return real_syscalls().pwrite(fd, b, n, off);
    };
    t.pread = [this](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
      if (ours(fd)) {
        if (fault_ == fault::eio_reads) {
          errno = EIO;
          return -1;
        }
        if (fault_ == fault::slow_reads) std::this_thread::sleep_for(delay_);
      }
      return real_syscalls().pread(fd, b, n, off);
    };
    t.uring_result = [this](bool is_write, int fd, std::uint64_t off, std::size_t n, int res) -> int {
      if (!ours(fd)) return res;
      switch (fault_.load()) {
        case fault::enospc_writes: return is_write ? -ENOSPC : res;
        case fault::eio_reads: return is_write ? res : -EIO;
        case fault::slow_reads:
          if (!is_write) std::this_thread::sleep_for(delay_);
          return res;
        case fault::slow_writes:
          if (is_write) std::this_thread::sleep_for(delay_);
          return res;
        case fault::torn_writes: return is_write ? -EIO : res;
        default: return res;
      }
      (void)off;
      (void)n;
    };
    seam_ = std::make_unique<scoped_syscalls>(t);
  }
  void clear() { fault_ = fault::none; }

  op_result put(const std::vector<key>& keys, const op_options& oo = {}) {
    std::vector<std::vector<std::uint8_t>> data;
    std::vector<buffer_view> v;
    for (const key& k : keys) data.push_back(content(k));
    for (auto& d : data) v.push_back(buffer_view::host(d.data(), block));
    return store_->put(keys, v, oo);
  }
  // Gets into sentinel rows; checks hits are right and misses untouched; returns the result and keeps the rows.
  op_result get(const std::vector<key>& keys, std::vector<std::vector<std::uint8_t>>& rows, const op_options& oo = {}) {
    rows.assign(keys.size(), std::vector<std::uint8_t>(block, 0x5A));
    std::vector<buffer_view> v;
    for (auto& r : rows) v.push_back(buffer_view::host(r.data(), block));
    op_result res = store_->get(keys, v, oo);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (res.ok[i]) {
        EXPECT_EQ(rows[i], content(keys[i])) << "wrong bytes for " << keys[i].to_string();
      } else {
        EXPECT_TRUE(untouched(rows[i])) << "a miss wrote its row";
      }
    }
    return res;
  }
  static bool untouched(const std::vector<std::uint8_t>& r) {
    return std::all_of(r.begin(), r.end(), [](std::uint8_t b) { return b == 0x5A; });
  }

  test::temp_dir dir_;
  store_options o_;
  std::unique_ptr<block_store> store_;
  ino_t inode_ = 0;
  std::atomic<fault> fault_{fault::none};
  std::chrono::milliseconds delay_{0};
  std::unique_ptr<scoped_syscalls> seam_;
};

TEST_P(kv_faults, enospc_fails_the_put_and_the_store_keeps_serving) {
  const auto before = keys_from(0, 10);
  ASSERT_EQ(put(before).ok_count, 10u);
  inject(fault::enospc_writes);
  const op_result p = put(keys_from(100, 10));
  EXPECT_EQ(p.ok_count, 0u);
  for (const auto& e : p.errors) EXPECT_EQ(e, std::errc::no_space_on_device);
  const auto held = store_->lookup(keys_from(100, 10));
  EXPECT_EQ(std::count(held.begin(), held.end(), true), 0);
  std::vector<std::vector<std::uint8_t>> rows;
  EXPECT_EQ(get(before, rows).ok_count, 10u);
  EXPECT_GE(store_->stats().no_space, 10u);
  clear();
  EXPECT_EQ(put(keys_from(100, 10)).ok_count, 10u);
  EXPECT_EQ(get(keys_from(100, 10), rows).ok_count, 10u);
}

TEST_P(kv_faults, eio_on_reads_is_a_miss_and_blocks_stay) {
  const auto keys = keys_from(0, 12);
  ASSERT_EQ(put(keys).ok_count, 12u);
  inject(fault::eio_reads);
  std::vector<std::vector<std::uint8_t>> rows;
  const op_result g = get(keys, rows);
  EXPECT_EQ(g.ok_count, 0u);
  EXPECT_EQ(g.errors[0], std::errc::io_error);
  EXPECT_EQ(store_->stats().io_errors, 12u);
  clear();
  EXPECT_EQ(get(keys, rows).ok_count, 12u);
}

TEST_P(kv_faults, slow_reads_end_at_the_deadline_and_nothing_lands_afterwards) {
  const auto keys = keys_from(0, 6);
  ASSERT_EQ(put(keys).ok_count, 6u);
  inject(fault::slow_reads, 700ms);
  std::vector<std::vector<std::uint8_t>> rows;
  const auto t0 = std::chrono::steady_clock::now();
  const op_result g = get(keys, rows, op_options{std::chrono::steady_clock::now() + 200ms});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 900ms) << "the get outlived its deadline";
  EXPECT_EQ(g.ok_count, 0u);
  EXPECT_EQ(g.errors[0], std::errc::timed_out);
  // The held requests end now (one after another where one thread completes them all), into the store's
  // memory only.
  for (int i = 0; i < 2000 && store_->stats().quarantined != 0; ++i) std::this_thread::sleep_for(10ms);
  for (const auto& r : rows) EXPECT_TRUE(untouched(r)) << "bytes landed after the get returned";
  EXPECT_EQ(store_->stats().quarantined, 0u);
  clear();
  EXPECT_EQ(get(keys, rows).ok_count, 6u);
}

TEST_P(kv_faults, slow_writes_end_at_the_deadline_and_their_slots_come_back) {
  ASSERT_EQ(put(keys_from(500, 2)).ok_count, 2u);  // a checkpoint is written: the slow writes are of blocks
  inject(fault::slow_writes, 1200ms);
  const auto t0 = std::chrono::steady_clock::now();
  const op_result p = put(keys_from(0, 4), op_options{std::chrono::steady_clock::now() + 200ms});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 900ms);
  EXPECT_EQ(p.ok_count, 0u);
  EXPECT_EQ(p.errors[0], std::errc::timed_out);
  for (int i = 0; i < 2000 && store_->stats().quarantined != 0; ++i) std::this_thread::sleep_for(10ms);
  clear();
  // Every slot is usable again: the whole capacity fills.
  for (int round = 0; round < 8; ++round) EXPECT_EQ(put(keys_from(1000 + round * 8, 8)).ok_count, 8u);
  EXPECT_EQ(store_->stats().blocks, 64u);
  EXPECT_LE(store_->stats().physical_bytes, o_.capacity_bytes);
}

TEST_P(kv_faults, a_torn_write_is_never_served) {
  const auto good = keys_from(0, 5);
  ASSERT_EQ(put(good).ok_count, 5u);
  inject(fault::torn_writes);
  const op_result p = put(keys_from(50, 5));
  EXPECT_EQ(p.ok_count, 0u);
  clear();
  store_->close();
  store_ = std::make_unique<block_store>(o_);
  std::vector<std::vector<std::uint8_t>> rows;
  EXPECT_EQ(get(keys_from(50, 5), rows).ok_count, 0u);
  EXPECT_EQ(get(good, rows).ok_count, 5u);
}

INSTANTIATE_TEST_SUITE_P(engines, kv_faults, ::testing::Values(engine_kind::threads, engine_kind::io_uring),
                         [](const auto& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace gdskit::kv
