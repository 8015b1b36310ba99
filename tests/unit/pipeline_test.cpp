// The staged pipeline with a host-memory copier whose copies only happen when waited for: a pipeline that
// reused a slot before its copy finished, or wrote a slot to the file before the device copy landed, would
// produce wrong bytes here.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "api/file_access.hpp"
#include "engine/host_copier.hpp"
#include "engine/pipeline.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using test::random_bytes;
using test::temp_dir;

class deferred_copier final : public engine::copier {
 public:
  deferred_copier(unsigned lanes, unsigned slots, std::size_t slot_bytes)
      : lanes_(lanes), slots_(slots), slot_bytes_(slot_bytes), memory_(lanes * slots * slot_bytes + 4096),
        pending_(lanes * slots) {
    auto addr = reinterpret_cast<std::uintptr_t>(memory_.data());
    base_ = reinterpret_cast<std::byte*>(memory_.data()) + (4096 - addr % 4096) % 4096;
  }
  unsigned lanes() const override { return lanes_; }
  unsigned slots_per_lane() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  void begin_lane(unsigned lane) override {
    if (static_cast<int>(lane) == fail_begin_lane) throw error(cuda_code(2), "cuMemHostRegister (injected)");
    ++lanes_started;
  }
  void ready_lane(unsigned lane) override {
    if (static_cast<int>(lane) == fail_ready_lane) throw error(cuda_code(2), "cuMemHostAlloc (injected)");
    std::lock_guard lock(ready_mutex_);
    readied_.insert(lane);
  }
  std::set<unsigned> readied() const {
    std::lock_guard lock(ready_mutex_);
    return readied_;
  }
  void end_lane(unsigned lane) noexcept override {
    for (unsigned s = 0; s < slots_; ++s) {
      EXPECT_TRUE(pending_[lane * slots_ + s].empty()) << "a lane ended with copies in flight";
    }
    ++lanes_ended;
  }
  std::byte* slot(unsigned lane, unsigned s) override {
    expect_ready(lane);
    return base_ + (lane * slots_ + s) * slot_bytes_;
  }
  void expect_ready(unsigned lane) const {
    std::lock_guard lock(ready_mutex_);
    EXPECT_TRUE(readied_.count(lane) != 0) << "lane " << lane << " used before ready_lane";
  }
  void to_far(unsigned lane, unsigned s, std::size_t off, std::uintptr_t far, std::size_t n) override {
    expect_ready(lane);
    if (fail_after >= 0 && copies++ >= fail_after) throw error(cuda_code(700), "cuMemcpyHtoDAsync (injected)");
    EXPECT_LE(off + n, slot_bytes_);
    auto& p = pending_[lane * slots_ + s];
    EXPECT_TRUE(p.empty()) << "a slot was reused before its copy was waited for";
    p.push_back({true, off, far, n});
  }
  void from_far(unsigned lane, unsigned s, std::size_t off, std::uintptr_t far, std::size_t n) override {
    expect_ready(lane);
    if (fail_after >= 0 && copies++ >= fail_after) throw error(cuda_code(700), "cuMemcpyDtoHAsync (injected)");
    EXPECT_LE(off + n, slot_bytes_);
    auto& p = pending_[lane * slots_ + s];
    // A piece made of several extents fills its slot in several copies, each starting where the one before
    // ended; any other copy into a slot with copies pending is a slot reused before it was waited for.
    EXPECT_TRUE(p.empty() || (!p.back().to_far && off == p.back().slot_offset + p.back().n))
        << "a slot was reused before its copy was waited for";
    p.push_back({false, off, far, n});
  }
  void wait(unsigned lane, unsigned s) override {
    expect_ready(lane);
    ++waits;
    auto& p = pending_[lane * slots_ + s];
    for (auto& op : p) {
      std::byte* mem = slot(lane, s) + op.slot_offset;
      if (op.to_far) {
        std::memcpy(reinterpret_cast<void*>(op.far), mem, op.n);
      } else {
        std::memcpy(mem, reinterpret_cast<const void*>(op.far), op.n);
      }
    }
    p.clear();
  }
  std::size_t still_pending() const {
    std::size_t n = 0;
    for (auto& p : pending_) n += p.size();
    return n;
  }

  std::atomic<int> lanes_started{0};
  std::atomic<int> lanes_ended{0};
  std::atomic<int> waits{0};
  std::atomic<int> copies{0};
  int fail_after = -1;
  int fail_begin_lane = -1;  // begin_lane of this lane throws (its context could not be made current)
  int fail_ready_lane = -1;  // ready_lane of this lane throws (its pinned slots could not be made)

 private:
  struct op {
    bool to_far;
    std::size_t slot_offset;
    std::uintptr_t far;
    std::size_t n;
  };
  unsigned lanes_, slots_;
  std::size_t slot_bytes_;
  std::vector<std::uint8_t> memory_;
  std::byte* base_ = nullptr;
  std::vector<std::vector<op>> pending_;
  mutable std::mutex ready_mutex_;
  std::set<unsigned> readied_;
};

settings test_settings(direct_mode d) {
  settings s;
  s.direct = d;
  s.chunk_bytes = 65536;
  return s;
}

class staged : public ::testing::TestWithParam<direct_mode> {};

TEST_P(staged, reads_equal_reference_at_odd_offsets) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  std::mt19937_64 rng(5);
  for (std::size_t size : {std::size_t{1}, std::size_t{4097}, std::size_t{(3u << 20) + 17}}) {
    auto data = random_bytes(size, size);
    test::write_file(dir / "f", data);
    file_handle f(dir / "f", open_mode::read, {}, test_settings(GetParam()));
    for (int r = 0; r < 12; ++r) {
      deferred_copier cp(3, 2, 256 * 1024);
      std::uint64_t off = rng() % size;
      std::size_t len = static_cast<std::size_t>(rng() % (size + 300000));
      if (r == 0) {
        off = 0;
        len = size;
      }
      std::vector<std::uint8_t> out(len + 1, 0xAB);
      engine::staged_stats st;
      std::size_t got = engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), len, off, {}, &st);
      std::size_t expect = std::min<std::size_t>(len, size - off);
      ASSERT_EQ(got, expect);
      ASSERT_EQ(0, std::memcmp(out.data(), data.data() + off, got)) << "size " << size << " off " << off;
      EXPECT_EQ(out[len], 0xAB) << "wrote past the request";
      EXPECT_EQ(cp.still_pending(), 0u);
      EXPECT_EQ(st.direct_bytes + st.buffered_bytes, got);
      if (GetParam() == direct_mode::off) EXPECT_EQ(st.direct_bytes, 0u);
    }
  }
}

TEST_P(staged, writes_read_back_equal) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  std::mt19937_64 rng(6);
  std::vector<std::uint8_t> mirror;
  file_handle f(dir / "w", open_mode::read_write, {.create = true}, test_settings(GetParam()));
  for (int r = 0; r < 10; ++r) {
    deferred_copier cp(2, 3, 128 * 1024);
    std::uint64_t off = rng() % 2000000;
    std::size_t len = static_cast<std::size_t>(rng() % 1500000) + 1;
    auto src = random_bytes(len, static_cast<std::uint64_t>(r));
    EXPECT_EQ(engine::staged_write(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(src.data()), len, off), len);
    EXPECT_EQ(cp.still_pending(), 0u);
    if (mirror.size() < off + len) mirror.resize(off + len, 0);
    std::memcpy(mirror.data() + off, src.data(), len);
  }
  EXPECT_EQ(test::read_file(dir / "w"), mirror);
}

// The adaptive scheduler's knobs: pieces smaller than a slot, and lanes parked and woken while the transfer
// runs. Bytes must stay exact, every piece must be the asked size, and parked lanes must not take pieces.
TEST_P(staged, smaller_pieces_and_parked_lanes_keep_bytes_exact) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  const std::size_t size = (5u << 20) + 4095;
  auto data = random_bytes(size, 11);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read_write, {}, test_settings(GetParam()));
  std::mt19937_64 rng(12);
  for (int r = 0; r < 8; ++r) {
    deferred_copier cp(4, 2, 256 * 1024);
    engine::staged_options o;
    o.piece_bytes = std::size_t{64 * 1024} << (r % 3);  // 64, 128, 256 KiB (256 KiB = the slot)
    std::atomic<unsigned> active{1};
    std::atomic<std::size_t> pieces{0};
    std::atomic<std::size_t> direct{0};
    o.active_lanes = [&] { return active.load(); };
    o.on_piece = [&](std::uint64_t) {
      if (++pieces == 10) active = 3;  // the depth grows mid-transfer
    };
    o.on_direct_bytes = [&](std::size_t n, std::size_t) { direct += n; };
    const std::uint64_t off = rng() % 100000;
    const std::size_t len = size - off - static_cast<std::size_t>(rng() % 5000);
    std::vector<std::uint8_t> out(len);
    engine::staged_stats st;
    ASSERT_EQ(engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), len, off, o, &st), len);
    ASSERT_EQ(0, std::memcmp(out.data(), data.data() + off, len));
    EXPECT_EQ(st.pieces, engine::piece_count(off, len, o.piece_bytes));
    EXPECT_EQ(direct.load(), st.direct_bytes);
    // Writes with the same knobs, read back.
    auto src = random_bytes(len, static_cast<std::uint64_t>(r) + 100);
    active = 1;
    pieces = 0;
    ASSERT_EQ(engine::staged_write(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(src.data()), len, off, o, &st), len);
    std::memcpy(data.data() + off, src.data(), len);
    ASSERT_EQ(test::read_file(dir / "f"), data);
    EXPECT_EQ(cp.still_pending(), 0u);
  }
}

// The request size asked for while the transfer runs: every piece is cut at the size of the moment (sizes
// that do not fit a slot are taken as the slot), and the bytes stay exact whatever the sizes in between.
TEST_P(staged, request_size_changes_while_the_transfer_runs) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  const std::size_t size = (6u << 20) + 777;
  auto data = random_bytes(size, 21);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read_write, {}, test_settings(GetParam()));
  const std::size_t sizes[] = {64 * 1024, 256 * 1024, 128 * 1024, 4096 * 3, 256 * 1024 + 4096, 8192};
  std::mt19937_64 rng(22);
  for (int r = 0; r < 6; ++r) {
    deferred_copier cp(3, 2, 256 * 1024);
    engine::staged_options o;
    std::atomic<unsigned> asked{0};
    std::mutex m;
    std::vector<std::size_t> seen;  // the request size of each piece
    o.request_bytes = [&] { return sizes[asked++ % std::size(sizes)]; };
    o.min_request_bytes = 4096;
    std::atomic<std::size_t> reported{0};
    o.on_direct_bytes = [&](std::size_t n, std::size_t request) {
      reported += n;
      std::lock_guard lock(m);
      seen.push_back(request);
    };
    const std::uint64_t off = rng() % 300000;
    const std::size_t len = size - off - static_cast<std::size_t>(rng() % 3000);
    std::vector<std::uint8_t> out(len);
    engine::staged_stats st;
    ASSERT_EQ(engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), len, off, o, &st), len);
    ASSERT_EQ(0, std::memcmp(out.data(), data.data() + off, len));
    EXPECT_GT(st.pieces, engine::piece_count(off, len, 256 * 1024));  // smaller sizes were used too
    EXPECT_EQ(reported.load(), st.direct_bytes);
    for (const std::size_t request : seen) {
      EXPECT_TRUE(request == 64 * 1024 || request == 128 * 1024 || request == 256 * 1024 || request == 4096 * 3 ||
                  request == 8192)
          << request;
    }
    auto src = random_bytes(len, static_cast<std::uint64_t>(r) + 200);
    ASSERT_EQ(engine::staged_write(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(src.data()), len, off, o, &st), len);
    std::memcpy(data.data() + off, src.data(), len);
    ASSERT_EQ(test::read_file(dir / "f"), data);
    EXPECT_EQ(cp.still_pending(), 0u);
  }
}

// A gathered write: extents of any size and alignment, with gaps and out of order in memory, land byte for
// byte; pieces span extents only where they meet; every byte is reported once; the rest of the file is
// untouched.
TEST_P(staged, gathered_extents_land_byte_for_byte) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  const std::size_t size = (3u << 20) + 999;
  auto mirror = random_bytes(size, 41);
  test::write_file(dir / "g", mirror);
  file_handle f(dir / "g", open_mode::read_write, {}, test_settings(GetParam()));
  std::mt19937_64 rng(42);
  for (int r = 0; r < 6; ++r) {
    std::vector<std::vector<std::uint8_t>> sources;
    std::vector<engine::staged_extent> extents;
    for (std::uint64_t pos = rng() % 5000; pos < size;) {
      const std::size_t n = std::min<std::size_t>(size - pos, 1 + rng() % (r % 2 ? 300000 : 5000));
      sources.push_back(random_bytes(n, rng()));
      extents.push_back({reinterpret_cast<std::uintptr_t>(sources.back().data()), pos, n});
      pos += n + rng() % 9000;  // a gap the write must not touch
    }
    std::shuffle(extents.begin(), extents.end(), rng);  // any order in memory
    std::vector<engine::staged_extent> sorted = extents;
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    deferred_copier cp(3, 2, 256 * 1024);
    engine::staged_options o;
    std::atomic<unsigned> asked{0};
    o.request_bytes = [&] { return std::size_t{64 * 1024} << (asked++ % 3); };
    std::atomic<std::size_t> reported{0};
    o.on_bytes = [&](std::size_t n) { reported += n; };
    std::size_t total = 0;
    for (const auto& e : sorted) total += e.nbytes;
    ASSERT_EQ(engine::staged_write_extents(detail::open_file_of(f), cp, sorted, o), total);
    EXPECT_EQ(reported.load(), total);
    EXPECT_EQ(cp.still_pending(), 0u);
    for (const auto& e : sorted) std::memcpy(mirror.data() + e.offset, reinterpret_cast<const void*>(e.far), e.nbytes);
    ASSERT_EQ(test::read_file(dir / "g"), mirror);
  }
}

// A checkpoint's layout: a header of odd length, then tensors of odd sizes back to back. Their joins fall inside
// aligned O_DIRECT requests: only the first and last partial blocks of the whole run go through the page cache
// (a small buffered write per join would, on ext4, wait for every O_DIRECT write in flight on the file).
TEST(staged_pipeline, back_to_back_extents_are_written_in_aligned_requests_across_their_joins) {
  const auto parent = test::direct_capable_parent();
  if (parent.empty()) GTEST_SKIP() << "no folder here accepts O_DIRECT";
  temp_dir dir(parent);
  file_handle f(dir / "t", open_mode::read_write, {.create = true}, test_settings(direct_mode::on));
  std::vector<std::vector<std::uint8_t>> sources;
  std::vector<engine::staged_extent> extents;
  std::uint64_t pos = 8 + 1003;
  for (int i = 0; i < 40; ++i) {
    const std::size_t n = 1 + (static_cast<std::size_t>(i) * 104729u) % 300000;
    sources.push_back(random_bytes(n, 900 + i));
    extents.push_back({reinterpret_cast<std::uintptr_t>(sources.back().data()), pos, n});
    pos += n;
  }
  deferred_copier cp(3, 2, 256 * 1024);
  engine::staged_options o;
  std::atomic<unsigned> asked{0};
  o.request_bytes = [&] { return std::size_t{64 * 1024} << (asked++ % 3); };
  const std::size_t a = f.choice().alignment;
  auto unaligned = std::make_shared<std::atomic<int>>(0);
  posix::syscall_table t = posix::real_syscalls();
  t.pwrite = [unaligned, a](int fd, const void* b, std::size_t n, off_t off) -> ssize_t {
    if (off % static_cast<off_t>(a) != 0 || n % a != 0) ++*unaligned;
    return posix::real_syscalls().pwrite(fd, b, n, off);
  };
  {
    posix::scoped_syscalls guard(t);
    ASSERT_EQ(engine::staged_write_extents(detail::open_file_of(f), cp, extents, o), pos - 1011);
  }
  EXPECT_LE(unaligned->load(), 2) << "joins between extents went through the page cache";
  auto bytes = test::read_file(dir / "t");
  ASSERT_EQ(bytes.size(), pos);
  for (std::size_t i = 0; i < extents.size(); ++i) {
    ASSERT_TRUE(std::equal(sources[i].begin(), sources[i].end(), bytes.begin() + extents[i].offset)) << "extent " << i;
  }
  EXPECT_EQ(cp.still_pending(), 0u);
}

// A copy that fails after other parts of the same piece were queued: those are still waited for before the lane
// ends (the fake checks at end_lane), and the error is the copy's.
TEST(staged_pipeline, a_failed_copy_inside_a_joined_piece_leaves_no_copy_in_flight) {
  temp_dir dir;
  for (int fail_at = 1; fail_at < 12; ++fail_at) {
    SCOPED_TRACE(fail_at);
    file_handle f(dir / "j", open_mode::write, {.create = true, .truncate = true}, test_settings(direct_mode::automatic));
    std::vector<std::vector<std::uint8_t>> sources;
    std::vector<engine::staged_extent> extents;
    std::uint64_t pos = 100;
    for (int i = 0; i < 30; ++i) {
      sources.push_back(random_bytes(20000 + 37 * i, 70 + i));
      extents.push_back({reinterpret_cast<std::uintptr_t>(sources.back().data()), pos, sources.back().size()});
      pos += sources.back().size();
    }
    deferred_copier cp(2, 2, 128 * 1024);
    cp.fail_after = fail_at;
    engine::staged_options o;
    std::error_code ec;
    try {
      engine::staged_write_extents(detail::open_file_of(f), cp, extents, o);
    } catch (const error& e) {
      ec = e.code();
    }
    EXPECT_EQ(ec, cuda_code(700));
    EXPECT_EQ(cp.still_pending(), 0u);
    EXPECT_EQ(cp.lanes_started.load(), cp.lanes_ended.load());
  }
}

// Lanes are set up by the workers that use them; one that cannot be (its context cannot be made current, or
// no pinned memory is left for its slots) fails the transfer with its error, in both directions, while the
// lanes that did start finish their copies and end.
TEST(staged_pipeline, a_lane_that_cannot_be_set_up_fails_the_transfer_in_both_directions) {
  temp_dir dir;
  const auto data = random_bytes((2u << 20) + 123, 91);
  test::write_file(dir / "r", data);
  for (bool at_ready : {false, true}) {
    for (bool write : {false, true}) {
      SCOPED_TRACE(testing::Message() << "ready_lane fails " << at_ready << " write " << write);
      file_handle f(dir / (write ? "w" : "r"), write ? open_mode::write : open_mode::read,
                    write ? open_options{.create = true, .truncate = true} : open_options{},
                    test_settings(direct_mode::automatic));
      // begin_lane runs at every lane's start, so lane 2 of 4 always meets it; ready_lane only before a lane's
      // first piece, which the other lanes could have taken all of: a single lane must meet it.
      deferred_copier cp(at_ready ? 1 : 4, 2, 64 * 1024);
      (at_ready ? cp.fail_ready_lane : cp.fail_begin_lane) = at_ready ? 0 : 2;
      std::vector<std::uint8_t> mem(data);
      const auto far = reinterpret_cast<std::uintptr_t>(mem.data());
      std::error_code ec;
      try {
        if (write) {
          engine::staged_write(detail::open_file_of(f), cp, far, mem.size(), 0);
        } else {
          engine::staged_read(detail::open_file_of(f), cp, far, mem.size(), 0);
        }
      } catch (const error& e) {
        ec = e.code();
      }
      EXPECT_EQ(ec, cuda_code(2));
      EXPECT_EQ(cp.still_pending(), 0u);
      // A lane whose begin_lane threw does not end; one whose ready_lane threw does.
      EXPECT_EQ(cp.lanes_started.load(), at_ready ? 1 : 3);
      EXPECT_EQ(cp.lanes_ended.load(), cp.lanes_started.load());
      EXPECT_EQ(cp.readied().count(at_ready ? 0 : 2), 0u);
    }
  }
}

// Lanes parked by the adaptive depth get their slot memory only once the depth comes within one doubling of
// them: at depth 1 a transfer over 16 lanes readies lanes 0 and 1 at most; when the depth grows to 3
// mid-transfer, lanes 3 to 5 are readied while still parked (the working lanes wait for that, for at most two
// seconds, before their next piece), and none beyond 5.
TEST(staged_pipeline, parked_lanes_are_readied_only_when_the_depth_comes_near) {
  temp_dir dir;
  const auto data = random_bytes((4u << 20) + 4321, 95);
  test::write_file(dir / "r", data);
  file_handle f(dir / "r", open_mode::read_write, {}, test_settings(direct_mode::automatic));
  for (bool grow : {false, true}) {
    for (bool write : {false, true}) {
      SCOPED_TRACE(testing::Message() << "grow " << grow << " write " << write);
      deferred_copier cp(16, 2, 64 * 1024);
      engine::staged_options o;
      std::atomic<unsigned> active{1};
      std::atomic<int> pieces{0};
      o.active_lanes = [&] { return active.load(); };
      o.on_piece = [&](std::uint64_t) {
        if (!grow || ++pieces < 8) return;
        active = 3;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (std::chrono::steady_clock::now() < until) {
          const std::set<unsigned> r = cp.readied();
          if (r.count(3) != 0 && r.count(4) != 0 && r.count(5) != 0) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      };
      std::vector<std::uint8_t> mem(data);
      const auto far = reinterpret_cast<std::uintptr_t>(mem.data());
      if (write) {
        ASSERT_EQ(engine::staged_write(detail::open_file_of(f), cp, far, mem.size(), 0, o), mem.size());
        EXPECT_EQ(test::read_file(dir / "r"), data);
      } else {
        ASSERT_EQ(engine::staged_read(detail::open_file_of(f), cp, far, mem.size(), 0, o), mem.size());
        EXPECT_EQ(mem, data);
      }
      const std::set<unsigned> got = cp.readied();
      ASSERT_FALSE(got.empty());
      EXPECT_LE(*got.rbegin(), grow ? 5u : 1u);
      EXPECT_TRUE(got.count(0) != 0);
      if (grow) {
        for (unsigned lane : {3u, 4u, 5u}) EXPECT_TRUE(got.count(lane) != 0) << "parked lane " << lane << " not readied";
      }
      EXPECT_EQ(cp.lanes_started.load(), 16);
      EXPECT_EQ(cp.still_pending(), 0u);
    }
  }
}

// The host copier moves bytes both ways at any offset in a slot, and a later copier of the same lane size gets
// the lanes an earlier one gave back instead of mapping new memory.
TEST(host_copier, copies_both_ways_and_reuses_idle_lanes) {
  const std::size_t slot = 7 * 3 * 4096;  // a size no other test uses: the pool is the process's
  std::set<std::byte*> first;
  {
    engine::host_copier cp(2, 2, slot);
    const auto src = random_bytes(5000, 3);
    std::vector<std::uint8_t> back(5000, 0);
    for (unsigned lane = 0; lane < 2; ++lane) {
      cp.begin_lane(lane);
      cp.ready_lane(lane);
      for (unsigned s = 0; s < 2; ++s) {
        ASSERT_EQ(reinterpret_cast<std::uintptr_t>(cp.slot(lane, s)) % 4096, 0u);
        first.insert(cp.slot(lane, s));
        cp.from_far(lane, s, 123, reinterpret_cast<std::uintptr_t>(src.data()), src.size());
        cp.wait(lane, s);
        EXPECT_EQ(std::memcmp(cp.slot(lane, s) + 123, src.data(), src.size()), 0);
        cp.to_far(lane, s, 123, reinterpret_cast<std::uintptr_t>(back.data()), back.size());
        EXPECT_EQ(back, src);
        std::fill(back.begin(), back.end(), 0);
      }
      cp.end_lane(lane);
    }
  }
  engine::host_copier again(2, 2, slot);
  for (unsigned lane = 0; lane < 2; ++lane) {
    again.begin_lane(lane);
    again.ready_lane(lane);
    for (unsigned s = 0; s < 2; ++s) EXPECT_EQ(first.count(again.slot(lane, s)), 1u) << "lane " << lane;
    again.end_lane(lane);
  }
  EXPECT_THROW(engine::host_copier(1, 2, 4095), error);
}

TEST(staged_pipeline, gathered_write_cancels_with_ecanceled) {
  temp_dir dir;
  file_handle f(dir / "c", open_mode::write, {.create = true}, test_settings(direct_mode::automatic));
  std::vector<std::vector<std::uint8_t>> sources;
  std::vector<engine::staged_extent> extents;
  for (std::uint64_t i = 0; i < 40; ++i) {
    sources.push_back(random_bytes(100000, i));
    extents.push_back({reinterpret_cast<std::uintptr_t>(sources.back().data()), i * 100000, 100000});
  }
  std::atomic<int> pieces{0};
  engine::staged_options o;
  o.on_bytes = [&](std::size_t) { ++pieces; };
  o.cancelled = [&] { return pieces.load() >= 5; };
  deferred_copier cp(2, 2, 128 * 1024);
  try {
    engine::staged_write_extents(detail::open_file_of(f), cp, extents, o);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::operation_canceled);
  }
  EXPECT_LT(pieces.load(), 40);
  EXPECT_EQ(cp.still_pending(), 0u);
}

// Write lanes parked by a shallow depth wait and join when the depth grows: the write ends up spread over
// more than the lanes it started with.
TEST_P(staged, parked_write_lanes_join_when_the_depth_grows) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  file_handle f(dir / "p", open_mode::read_write, {.create = true}, test_settings(GetParam()));
  const std::size_t len = (4u << 20) + 12345;
  auto src = random_bytes(len, 51);
  deferred_copier cp(4, 2, 64 * 1024);
  engine::staged_options o;
  std::atomic<unsigned> active{1};
  std::atomic<int> pieces{0};
  std::mutex m;
  std::condition_variable joined;
  std::set<std::thread::id> writers;
  o.active_lanes = [&] { return active.load(); };
  o.on_piece = [&](std::uint64_t) {
    if (++pieces == 8) active = 4;
    std::unique_lock lock(m);
    writers.insert(std::this_thread::get_id());
    joined.notify_all();
    // Once the depth has grown, the first lane waits (a bounded time) for another to take a piece, so the
    // outcome does not depend on how fast the first lane alone could finish.
    if (pieces >= 8) joined.wait_for(lock, std::chrono::seconds(2), [&] { return writers.size() > 1; });
  };
  ASSERT_EQ(engine::staged_write(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(src.data()), len, 0, o), len);
  EXPECT_EQ(test::read_file(dir / "p"), src);
  EXPECT_GT(writers.size(), 1u) << "lanes above the starting depth never wrote";
  EXPECT_EQ(cp.still_pending(), 0u);
}

// A file shorter than the range: the bytes up to its end, whatever sizes the pieces had.
TEST_P(staged, short_file_with_changing_request_sizes) {
  temp_dir dir(GetParam() == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{});
  const std::size_t size = (1u << 20) + 12345;
  auto data = random_bytes(size, 31);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read, {}, test_settings(GetParam()));
  deferred_copier cp(4, 2, 256 * 1024);
  engine::staged_options o;
  std::atomic<unsigned> asked{0};
  o.request_bytes = [&] { return (asked++ % 2) ? std::size_t{64 * 1024} : std::size_t{192 * 1024}; };
  const std::uint64_t off = 5000;
  std::vector<std::uint8_t> out(size);
  ASSERT_EQ(engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), size, off, o), size - off);
  ASSERT_EQ(0, std::memcmp(out.data(), data.data() + off, size - off));
}

INSTANTIATE_TEST_SUITE_P(direct, staged, ::testing::Values(direct_mode::automatic, direct_mode::on, direct_mode::off),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(staged_pipeline, piece_count_matches_the_pieces_a_transfer_uses) {
  EXPECT_EQ(engine::piece_count(0, 0, 4096), 0u);
  EXPECT_EQ(engine::piece_count(0, 1, 4096), 1u);
  EXPECT_EQ(engine::piece_count(0, 4096, 4096), 1u);
  EXPECT_EQ(engine::piece_count(0, 4097, 4096), 2u);
  EXPECT_EQ(engine::piece_count(4095, 2, 4096), 2u);  // straddles a slot boundary
  EXPECT_EQ(engine::piece_count(4096, 4096, 4096), 1u);
  EXPECT_EQ(engine::piece_count((std::uint64_t{5} << 32) + 1, 3 * 4096, 4096), 4u);
  // Cross-check against what a transfer reports: one piece per slot-sized step of the file.
  temp_dir dir;
  auto data = random_bytes(100000, 3);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read, {}, test_settings(direct_mode::off));
  std::mt19937_64 rng(9);
  for (int r = 0; r < 50; ++r) {
    const std::uint64_t off = rng() % 90000;
    const std::size_t len = 1 + static_cast<std::size_t>(rng() % (100000 - off));
    deferred_copier cp(2, 2, 8192);
    std::vector<std::uint8_t> out(len);
    engine::staged_stats st;
    engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), len, off, {}, &st);
    EXPECT_EQ(st.pieces, engine::piece_count(off, len, 8192)) << off << "+" << len;
  }
}

TEST(staged_pipeline, slots_are_reused_and_reads_run_ahead) {
  temp_dir dir;
  auto data = random_bytes(8u << 20, 1);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read, {}, test_settings(direct_mode::automatic));
  deferred_copier cp(2, 2, 256 * 1024);  // 32 pieces over 2 lanes x 2 slots
  std::vector<std::uint8_t> out(data.size());
  engine::staged_stats st;
  ASSERT_EQ(engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), out.size(), 0, {}, &st), data.size());
  EXPECT_EQ(out, data);
  EXPECT_EQ(st.pieces, 32u);
  // Each lane reads into its second slot before waiting on the first: waits happen only on reuse.
  EXPECT_GE(st.slot_waits, 32u - 4u);
  EXPECT_LE(st.slot_waits, 32u);
  EXPECT_EQ(cp.lanes_started.load(), 2);
  EXPECT_EQ(cp.lanes_ended.load(), 2) << "every lane begun is ended (the CUDA copier restores the context there)";
}

TEST(staged_pipeline, read_error_mid_stream_propagates_and_drains) {
  temp_dir dir;
  auto data = random_bytes(4u << 20, 2);
  test::write_file(dir / "f", data);
  const std::uint64_t bad = (2u << 20) + 5;
  posix::syscall_table t = posix::real_syscalls();
  t.pread = [&](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
    if (static_cast<std::uint64_t>(o) <= bad && bad < static_cast<std::uint64_t>(o) + n) {
      errno = EIO;
      return -1;
    }
    return posix::real_syscalls().pread(fd, b, n, o);
  };
  posix::scoped_syscalls guard(t);
  file_handle f(dir / "f", open_mode::read, {}, test_settings(direct_mode::off));
  deferred_copier cp(4, 2, 128 * 1024);
  std::vector<std::uint8_t> out(data.size());
  try {
    engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), out.size(), 0);
    FAIL() << "an I/O error must fail the transfer";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::io_error);
    EXPECT_LE(static_cast<std::uint64_t>(e.offset_bytes()), bad);
  }
  EXPECT_EQ(cp.still_pending(), 0u) << "copies still in flight after the error";
  EXPECT_EQ(cp.lanes_ended.load(), cp.lanes_started.load());
}

TEST(staged_pipeline, copy_error_propagates) {
  temp_dir dir;
  auto data = random_bytes(2u << 20, 3);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read_write, {}, test_settings(direct_mode::automatic));
  std::vector<std::uint8_t> out(data.size());
  deferred_copier cp(2, 2, 128 * 1024);
  cp.fail_after = 5;
  try {
    engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), out.size(), 0);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), cuda_code(700));
  }
  EXPECT_EQ(cp.still_pending(), 0u);
  deferred_copier cw(2, 2, 128 * 1024);
  cw.fail_after = 3;
  EXPECT_THROW(engine::staged_write(detail::open_file_of(f), cw, reinterpret_cast<std::uintptr_t>(data.data()), data.size(), 0), error);
  EXPECT_EQ(cw.still_pending(), 0u);
}

TEST(staged_pipeline, cancellation_stops_and_reports_ecanceled) {
  temp_dir dir;
  auto data = random_bytes(4u << 20, 4);
  test::write_file(dir / "f", data);
  file_handle f(dir / "f", open_mode::read, {}, test_settings(direct_mode::automatic));
  std::atomic<bool> cancel{false};
  std::atomic<int> pieces{0};
  engine::staged_options opt;
  opt.cancel = &cancel;
  opt.on_piece = [&](std::uint64_t) {
    if (++pieces == 3) cancel = true;
  };
  deferred_copier cp(2, 2, 128 * 1024);
  std::vector<std::uint8_t> out(data.size());
  try {
    engine::staged_read(detail::open_file_of(f), cp, reinterpret_cast<std::uintptr_t>(out.data()), out.size(), 0, opt);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::operation_canceled);
  }
  EXPECT_LT(pieces.load(), 32);
  EXPECT_EQ(cp.still_pending(), 0u);
}

// The staged path's split adds offset + nbytes: a range past 2^63 - 1 must be refused before any piece.
TEST(staged_pipeline, ranges_past_the_largest_offset_are_refused) {
  temp_dir dir;
  auto data = random_bytes(65536, 8);
  test::write_file(dir / "f", data);
  std::atomic<int> io_calls{0};
  posix::scoped_syscalls guard(test::counting_syscalls(io_calls));
  std::vector<std::uint8_t> buf(8192, 1);
  const auto far = reinterpret_cast<std::uintptr_t>(buf.data());
  for (direct_mode d : {direct_mode::automatic, direct_mode::off}) {
    file_handle f(dir / "f", open_mode::read_write, {}, test_settings(d));
    for (std::uint64_t off : {~std::uint64_t{0}, ~std::uint64_t{0} - 4095, std::uint64_t{1} << 63}) {
      deferred_copier cp(2, 2, 128 * 1024);
      try {
        engine::staged_write(detail::open_file_of(f), cp, far, 4096, off);
        FAIL() << "write at " << off;
      } catch (const error& e) {
        EXPECT_EQ(e.code(), std::errc::invalid_argument);
      }
      try {
        engine::staged_read(detail::open_file_of(f), cp, far, 4096, off);
        FAIL() << "read at " << off;
      } catch (const error& e) {
        EXPECT_EQ(e.code(), std::errc::invalid_argument);
      }
      EXPECT_EQ(cp.copies.load(), 0);
    }
    deferred_copier cp(2, 2, 128 * 1024);
    try {
      engine::staged_write(detail::open_file_of(f), cp, far, 8192, 9223372036854775807ull - 4096);
      FAIL();
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::file_too_large);
    }
  }
  EXPECT_EQ(io_calls.load(), 0);
  EXPECT_EQ(test::read_file(dir / "f"), data);
}

}  // namespace
}  // namespace gdskit
