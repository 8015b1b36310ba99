// The pool of idle staging buffers: reuse by kind, the cap on idle bytes, room made by dropping other kinds.
#include "common/idle_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace gdskit {
namespace {

// A buffer that counts how many of its kind are alive.
struct counted {
  explicit counted(std::atomic<int>& live, int id = 0) : live(&live), id(id) { ++live; }
  counted(counted&& o) noexcept : live(std::exchange(o.live, nullptr)), id(o.id) {}
  counted& operator=(counted&&) = delete;
  ~counted() {
    if (live != nullptr) --*live;
  }
  std::atomic<int>* live;
  int id;
};

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(idle_pool, gives_back_what_was_kept_by_kind) {
  std::atomic<int> live{0};
  idle_pool<std::size_t, counted> pool(8 * MiB);
  EXPECT_FALSE(pool.take(2 * MiB).has_value());
  pool.give(2 * MiB, 2 * MiB, counted(live, 7));
  EXPECT_EQ(live, 1);
  EXPECT_EQ(pool.idle_bytes(), 2 * MiB);
  EXPECT_FALSE(pool.take(4 * MiB).has_value()) << "a buffer of another size served";
  auto got = pool.take(2 * MiB);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->id, 7);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(idle_pool, frees_what_its_cap_cannot_keep) {
  std::atomic<int> live{0};
  {
    idle_pool<std::size_t, counted> pool(8 * MiB);
    for (int i = 0; i < 6; ++i) pool.give(2 * MiB, 2 * MiB, counted(live, i));
    EXPECT_EQ(live, 4) << "kept past the cap";
    EXPECT_EQ(pool.idle_bytes(), 8 * MiB);
    pool.give(16 * MiB, 16 * MiB, counted(live));  // larger than the whole cap
    EXPECT_EQ(live, 4);
    EXPECT_EQ(pool.idle_bytes(), 8 * MiB);
    pool.clear();
    EXPECT_EQ(live, 0);
    EXPECT_EQ(pool.idle_bytes(), 0u);
  }
  EXPECT_EQ(live, 0);
}

// A pool kept full of one size must still keep a larger buffer given back (its batch asks for it again),
// dropping as many of the others as it takes.
TEST(idle_pool, a_returned_kind_displaces_other_kinds) {
  std::atomic<int> live{0};
  idle_pool<std::size_t, counted> pool(8 * MiB);
  for (int i = 0; i < 4; ++i) pool.give(2 * MiB, 2 * MiB, counted(live, i));
  pool.give(4 * MiB, 4 * MiB, counted(live, 100));
  EXPECT_EQ(pool.idle_bytes(), 8 * MiB);
  EXPECT_EQ(live, 3) << "two 2 MiB buffers make room for the 4 MiB one";
  auto big = pool.take(4 * MiB);
  ASSERT_TRUE(big.has_value()) << "the larger buffer was turned away";
  EXPECT_EQ(big->id, 100);
  // The most recent returns win: a second 4 MiB buffer drops the last 2 MiB ones; full of its own kind, a
  // third is freed.
  pool.give(4 * MiB, 4 * MiB, std::move(*big));
  pool.give(4 * MiB, 4 * MiB, counted(live, 101));
  EXPECT_EQ(pool.idle_bytes(), 8 * MiB);
  EXPECT_EQ(live, 2);
  EXPECT_FALSE(pool.take(2 * MiB).has_value());
  pool.give(4 * MiB, 4 * MiB, counted(live, 102));
  EXPECT_EQ(live, 2) << "kept past the cap";
  EXPECT_TRUE(pool.take(4 * MiB).has_value());
  EXPECT_TRUE(pool.take(4 * MiB).has_value());
  EXPECT_FALSE(pool.take(4 * MiB).has_value());
}

TEST(idle_pool, keys_of_pairs_keep_devices_apart) {
  std::atomic<int> live{0};
  idle_pool<std::pair<int, std::size_t>, std::unique_ptr<counted>> pool(8 * MiB);
  pool.give({0, 2 * MiB}, 2 * MiB, std::make_unique<counted>(live, 1));
  EXPECT_FALSE(pool.take({1, 2 * MiB}).has_value()) << "device 0's buffer served device 1";
  auto got = pool.take({0, 2 * MiB});
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)->id, 1);
}

// Threads taking and giving side by side: nothing is lost or kept twice, and the cap holds.
TEST(idle_pool, threads_side_by_side_lose_nothing) {
  std::atomic<int> live{0};
  std::atomic<int> made{0};
  {
    idle_pool<std::size_t, counted> pool(16 * MiB);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 2000; ++i) {
          const std::size_t size = ((i + t) % 3 + 1) * MiB;
          std::optional<counted> c = pool.take(size);
          if (!c) {
            c.emplace(live);
            ++made;
          }
          pool.give(size, size, std::move(*c));
          EXPECT_LE(pool.idle_bytes(), 16 * MiB);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_LE(pool.idle_bytes(), 16 * MiB);
    EXPECT_GT(pool.idle_bytes(), 0u);
    EXPECT_LT(made, 8000) << "nothing was reused";
  }
  EXPECT_EQ(live, 0) << "a buffer outlived its pool";
}

}  // namespace
}  // namespace gdskit
