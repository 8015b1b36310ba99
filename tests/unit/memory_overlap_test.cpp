// Which tensors of a save share memory: exact for strided layouts, span-based where asked, n log n for many.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "formats/memory_overlap.hpp"

namespace gdskit::formats {
namespace {

using groups = std::vector<std::vector<std::size_t>>;

// A C-order array of `shape` at `address` with `itemsize`-byte elements, viewed through `strides` (in elements).
memory_layout array(std::uintptr_t address, std::size_t itemsize, std::vector<std::uint64_t> shape,
                    std::vector<std::int64_t> strides_items) {
  memory_layout l;
  l.address = address;
  l.itemsize = itemsize;
  l.shape = std::move(shape);
  for (auto s : strides_items) l.strides_bytes.push_back(s * static_cast<std::int64_t>(itemsize));
  return l;
}

memory_layout contiguous(std::uintptr_t address, std::size_t nbytes) { return array(address, 1, {nbytes}, {1}); }

// Whether the byte sets of two layouts meet, by listing every byte (the reference for small layouts).
bool brute_force(const memory_layout& a, const memory_layout& b) {
  auto bytes = [](const memory_layout& l) {
    std::set<std::int64_t> out;
    std::vector<std::uint64_t> at(l.shape.size(), 0);
    for (auto n : l.shape)
      if (n == 0) return out;
    for (;;) {
      std::int64_t addr = static_cast<std::int64_t>(l.address);
      for (std::size_t k = 0; k < at.size(); ++k) addr += static_cast<std::int64_t>(at[k]) * l.strides_bytes[k];
      for (std::size_t i = 0; i < l.itemsize; ++i) out.insert(addr + static_cast<std::int64_t>(i));
      std::size_t k = at.size();
      while (k > 0 && ++at[k - 1] == l.shape[k - 1]) at[--k] = 0;
      if (k == 0) return out;
    }
  };
  const auto x = bytes(a), y = bytes(b);
  for (auto v : x)
    if (y.count(v)) return true;
  return false;
}

TEST(memory_overlap, views_of_one_buffer) {
  const std::uintptr_t base = 0x10000;
  // numpy: base = np.zeros(100, uint8); grid = np.zeros((4, 6), float32) at 0x20000.
  const auto all = contiguous(base, 100);
  EXPECT_TRUE(layouts_overlap(all, all));
  EXPECT_FALSE(layouts_overlap(contiguous(base, 50), contiguous(base + 50, 50)));
  EXPECT_TRUE(layouts_overlap(contiguous(base, 10), contiguous(base + 5, 15)));
  // base[::2] and base[2:3]; base[::2] and base[1::2] (interleaved: no byte in common).
  EXPECT_TRUE(layouts_overlap(array(base, 1, {50}, {2}), contiguous(base + 2, 1)));
  EXPECT_FALSE(layouts_overlap(array(base, 1, {50}, {2}), array(base + 1, 1, {50}, {2})));
  // grid[:, ::2] and grid[:, 1::2]; grid[:, ::2] and grid.T[2] (column 2).
  const std::uintptr_t grid = 0x20000;
  const auto even = array(grid, 4, {4, 3}, {6, 2});
  const auto odd = array(grid + 4, 4, {4, 3}, {6, 2});
  EXPECT_FALSE(layouts_overlap(even, odd));
  EXPECT_TRUE(layouts_overlap(even, array(grid + 8, 4, {4}, {6})));
  // base[10:30] and base[::-1][75:85] (bytes 24 down to 15).
  EXPECT_TRUE(layouts_overlap(contiguous(base + 10, 20), array(base + 24, 1, {10}, {-1})));
  EXPECT_FALSE(layouts_overlap(contiguous(base + 30, 20), array(base + 24, 1, {10}, {-1})));
  // Broadcast (stride 0) and empty layouts.
  EXPECT_TRUE(layouts_overlap(array(base, 4, {1000, 3}, {0, 1}), contiguous(base + 11, 1)));
  EXPECT_FALSE(layouts_overlap(array(base, 4, {0, 3}, {3, 1}), all));
  // The span rule: a strided view counts as holding everything between its ends.
  auto spanned = array(base, 1, {50}, {2});
  spanned.exact = false;
  EXPECT_TRUE(layouts_overlap(spanned, array(base + 1, 1, {50}, {2})));
}

TEST(memory_overlap, exact_answers_match_listing_every_byte) {
  std::mt19937_64 rng(11);
  auto random_layout = [&] {
    std::uniform_int_distribution<int> dims(1, 3), size(1, 5), stride(-9, 9), item(1, 4), start(0, 40);
    memory_layout l;
    l.address = 1000 + static_cast<std::uintptr_t>(start(rng));
    l.itemsize = static_cast<std::size_t>(item(rng));
    for (int d = dims(rng); d > 0; --d) {
      l.shape.push_back(static_cast<std::uint64_t>(size(rng)));
      l.strides_bytes.push_back(stride(rng));
    }
    return l;
  };
  for (int i = 0; i < 20000; ++i) {
    const auto a = random_layout(), b = random_layout();
    ASSERT_EQ(layouts_overlap(a, b), brute_force(a, b)) << "case " << i;
  }
}

TEST(memory_overlap, groups_join_through_shared_members_and_keep_spaces_apart) {
  std::vector<memory_layout> t{contiguous(100, 10), contiguous(200, 10), contiguous(105, 10), contiguous(112, 10),
                               contiguous(300, 0)};
  EXPECT_EQ(shared_memory_groups(t), (groups{{0, 2, 3}}));
  t[1].space = "cuda:0";
  t.push_back(contiguous(205, 1));  // the same address in another space
  EXPECT_EQ(shared_memory_groups(t), (groups{{0, 2, 3}}));
  t.back().space = "cuda:0";
  EXPECT_EQ(shared_memory_groups(t), (groups{{0, 2, 3}, {1, 5}}));
  // A strided view whose span covers dense arrays in its holes shares nothing with them.
  std::vector<memory_layout> holes{array(0, 1, {10}, {10}), contiguous(1, 9), contiguous(11, 9), contiguous(50, 1)};
  EXPECT_EQ(shared_memory_groups(holes), (groups{{0, 3}}));
}

// Growth, not a time limit (machines and sanitizers differ): 16 times the tensors must cost far less than the
// 256 times a pairwise check would (n log n gives about 21; the bound, and the best of five runs of each,
// leave room for a machine loaded by other work).
TEST(memory_overlap, many_separate_tensors_take_n_log_n) {
  std::mt19937_64 rng(3);
  auto layouts = [&](std::size_t n) {
    std::vector<memory_layout> t;
    for (std::uintptr_t i = 0; i < n; ++i) t.push_back(array(0x100000 + i * 64, 4, {4, 2}, {2, 1}));
    std::shuffle(t.begin(), t.end(), rng);
    return t;
  };
  auto fastest = [](const std::vector<memory_layout>& t) {
    auto best = std::chrono::steady_clock::duration::max();
    for (int k = 0; k < 5; ++k) {
      const auto start = std::chrono::steady_clock::now();
      EXPECT_TRUE(shared_memory_groups(t).empty());
      best = std::min(best, std::chrono::steady_clock::now() - start);
    }
    return std::chrono::duration<double>(best).count();
  };
  const double small = fastest(layouts(4000));
  std::vector<memory_layout> t = layouts(64000);
  const double large = fastest(t);
  EXPECT_LT(large, 150 * std::max(small, 1e-4)) << "4,000 tensors " << small << " s, 64,000 " << large << " s";
  t.push_back(contiguous(0x100000 + 64 * 1000 + 4, 1));
  ASSERT_EQ(shared_memory_groups(t).size(), 1u);
  EXPECT_EQ(shared_memory_groups(t)[0].size(), 2u);
}

TEST(memory_overlap, impossible_layouts_are_refused) {
  auto l = contiguous(0, 10);
  l.strides_bytes.push_back(1);
  EXPECT_THROW(layouts_overlap(l, l), std::system_error);
  auto huge = array(0, 8, {std::uint64_t{1} << 62, 4}, {4, 1});
  EXPECT_THROW(layouts_overlap(huge, huge), std::system_error);
}

}  // namespace
}  // namespace gdskit::formats
