// The piece cursor: pieces tile every extent at the request size of the moment, and workers that the current
// depth keeps idle wait to be woken instead of polling.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/piece_cursor.hpp"

namespace gdskit::engine {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Joined, extents that meet in the file are cut as one range: pieces cross the joins (their segments give each
// extent's part and address), stop at every gap, and still end at multiples of their request size.
TEST(piece_cursor, joined_extents_are_cut_as_one_range_and_split_only_at_gaps) {
  std::vector<transfer_extent> e;
  std::uint64_t pos = 1000;
  std::uintptr_t far = 1 << 24;
  std::vector<std::uint64_t> gaps_at;
  for (int i = 0; i < 60; ++i) {
    const std::size_t n = 1 + (i * 7919u) % 20000;
    e.push_back({pos, n, far});
    pos += n;
    far += n + 64;  // apart in memory
    if (i % 17 == 16) {
      gaps_at.push_back(pos);
      pos += 333;
    }
  }
  for (bool join : {false, true}) {
    SCOPED_TRACE(join ? "joined" : "not joined");
    piece_cursor c(e, join);
    std::size_t sizes[] = {4096, 16384, 8192};
    std::vector<std::uint8_t> seen(pos, 0);
    std::size_t spanning = 0;
    for (std::size_t k = 0;; ++k) {
      auto p = c.take(sizes[k % 3]);
      if (!p) break;
      EXPECT_LE((p->offset % p->request_bytes) + p->nbytes, p->request_bytes);
      for (std::uint64_t g : gaps_at) EXPECT_FALSE(p->offset < g && p->offset + p->nbytes > g) << "a piece crosses a gap";
      std::size_t parts = 0, covered = 0;
      c.for_each_segment(*p, [&](std::uintptr_t a, std::size_t n, std::size_t at) {
        EXPECT_EQ(at, covered);
        // The address of each part is that extent's address for this file offset.
        const std::uint64_t off = p->offset + at;
        const auto it = std::find_if(e.begin(), e.end(), [&](const transfer_extent& x) {
          return off >= x.offset && off < x.offset + x.nbytes;
        });
        ASSERT_NE(it, e.end());
        EXPECT_EQ(a, it->far + (off - it->offset));
        EXPECT_LE(off + n, it->offset + it->nbytes) << "a part crosses into the next extent";
        for (std::uint64_t b = off; b < off + n; ++b) ++seen[b];
        covered += n;
        ++parts;
      });
      EXPECT_EQ(covered, p->nbytes);
      if (parts > 1) ++spanning;
    }
    for (const auto& x : e) {
      for (std::uint64_t b = x.offset; b < x.offset + x.nbytes; ++b) ASSERT_EQ(seen[b], 1) << "byte " << b;
    }
    if (join) {
      EXPECT_GT(spanning, 10u);
    } else {
      EXPECT_EQ(spanning, 0u);
    }
  }
}

TEST(piece_cursor, pieces_tile_extents_at_changing_sizes) {
  piece_cursor c({{4096 + 7, 3 * 4096, 1000}, {1 << 20, 5, 50000}});
  std::vector<piece_cursor::piece> got;
  std::size_t sizes[] = {4096, 8192, 4096, 65536};
  for (std::size_t k = 0;; ++k) {
    auto p = c.take(sizes[k % 4]);
    if (!p) break;
    got.push_back(*p);
  }
  ASSERT_TRUE(c.exhausted());
  std::uint64_t pos = 4096 + 7;
  std::size_t first_extent = 0;
  for (const auto& p : got) {
    if (p.offset >= (1 << 20)) break;
    EXPECT_EQ(p.offset, pos);
    EXPECT_EQ(p.far, 1000 + (p.offset - (4096 + 7)));
    EXPECT_LE((p.offset % p.request_bytes) + p.nbytes, p.request_bytes) << "a piece crosses its request boundary";
    pos += p.nbytes;
    first_extent += p.nbytes;
  }
  EXPECT_EQ(first_extent, 3u * 4096);
  EXPECT_EQ(got.back().offset, std::uint64_t{1} << 20);
  EXPECT_EQ(got.back().nbytes, 5u);
  EXPECT_EQ(got.back().far, 50000u);
}

// A worker above the depth is parked: in a tenth of a second it looks at most a few times (a polling worker,
// sleeping a millisecond between looks, would look about a hundred times).
TEST(piece_cursor, a_parked_worker_does_not_poll) {
  piece_cursor c(0, 1 << 30);
  ASSERT_TRUE(c.may_take(0, 2));
  unsigned looks = 0;
  const auto until = clock_type::now() + 100ms;
  while (clock_type::now() < until) {
    EXPECT_FALSE(c.may_take(5, 2));
    ++looks;
  }
  EXPECT_LE(looks, 4u);
}

// The timeout is long here, so only a wake-up can return in time: a worker that sees the depth grow, the last
// piece handed out and wake_all() each wake a parked worker at once.
TEST(piece_cursor, parked_workers_wake_when_the_depth_grows_or_the_pieces_run_out) {
  for (int how = 0; how < 3; ++how) {
    piece_cursor c(0, 1 << 20);
    c.set_park_timeout(std::chrono::milliseconds(60'000));
    ASSERT_TRUE(c.may_take(0, 1));
    std::atomic<bool> parked{false};
    std::atomic<bool> returned{false};
    bool result = true;
    std::thread worker([&] {
      parked = true;
      result = c.may_take(3, 1);
      returned = true;
    });
    while (!parked) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);  // let it wait
    EXPECT_FALSE(returned.load());
    const auto t0 = clock_type::now();
    if (how == 0) {
      EXPECT_TRUE(c.may_take(0, 8));  // worker 0 sees the depth grow to 8
    } else if (how == 1) {
      while (c.take(1 << 18)) {
      }
    } else {
      c.wake_all();
    }
    worker.join();
    EXPECT_LT(clock_type::now() - t0, 30s) << "case " << how;
    EXPECT_FALSE(result);  // it looks again and then sees why it woke
    if (how == 0) EXPECT_TRUE(c.may_take(3, 8));
    if (how == 1) EXPECT_TRUE(c.may_take(3, 1));  // exhausted: it must see the end
  }
}

}  // namespace
}  // namespace gdskit::engine
