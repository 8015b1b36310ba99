// The linear-time sort a batch's ranges are checked and planned in: the same order as a stable comparison sort,
// for every spread of keys (ties, the full 64 bits, keys near 2^63, inputs already in order or reversed).
#include "common/key_sort.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <vector>

namespace gdskit {
namespace {

bool by_key(const key_value& a, const key_value& b) { return a.key < b.key; }

std::vector<key_value> random_items(std::size_t n, std::uint64_t base, std::uint64_t spread, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<key_value> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = {base + (spread == 0 ? 0 : g() % spread), i};
  return v;
}

void expect_same(const std::vector<key_value>& got, const std::vector<key_value>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].key, want[i].key) << "at " << i;
    ASSERT_EQ(got[i].value, want[i].value) << "at " << i;
  }
}

TEST(key_sort, matches_a_stable_comparison_sort_for_every_spread_of_keys) {
  const std::uint64_t top = std::uint64_t{1} << 63;
  struct spread {
    std::uint64_t base, width;
  };
  const std::array<spread, 7> spreads{{{0, 0}, {0, 3}, {4096, 1000}, {0, std::uint64_t{8} << 30},
                                       {top - 5000, 4999}, {0, UINT64_MAX}, {1, top}}};
  std::vector<key_value> scratch;  // reused across calls of different sizes
  std::uint64_t seed = 1;
  for (std::size_t n : {0u, 1u, 2u, 255u, 256u, 257u, 3000u, 65536u}) {
    for (const spread& s : spreads) {
      std::vector<key_value> items = random_items(n, s.base, s.width, seed++);
      std::vector<key_value> want = items;
      std::stable_sort(want.begin(), want.end(), by_key);
      stable_sort_by_key(items, scratch);
      SCOPED_TRACE(testing::Message() << "n " << n << " base " << s.base << " width " << s.width);
      expect_same(items, want);
    }
  }
}

TEST(key_sort, keeps_sorted_input_and_reverses_reversed_input) {
  std::vector<key_value> up(5000), down(5000);
  for (std::size_t i = 0; i < up.size(); ++i) {
    up[i] = {i * 4096, i};
    down[i] = {(up.size() - 1 - i) * 4096, i};
  }
  std::vector<key_value> want = up;
  stable_sort_by_key(up);
  expect_same(up, want);
  stable_sort_by_key(down);
  for (std::size_t i = 0; i < down.size(); ++i) {
    ASSERT_EQ(down[i].key, i * 4096);
    ASSERT_EQ(down[i].value, down.size() - 1 - i);
  }
}

TEST(key_sort, sorts_by_group_then_key_groups_in_address_order) {
  std::array<int, 5> files{};
  for (std::size_t n : {1u, 100u, 4000u, 65536u}) {
    for (std::size_t groups : {1u, 2u, 5u}) {
      std::mt19937_64 g(n * 7 + groups);
      std::vector<key_value> items = random_items(n, 0, n / 3 + 1, n + groups);  // ties within and across groups
      std::vector<const int*> group(n);
      for (std::size_t i = 0; i < n; ++i) group[i] = &files[g() % groups];
      auto group_of = [&](std::uint64_t v) -> const void* { return group[v]; };
      std::vector<key_value> want = items;
      std::stable_sort(want.begin(), want.end(), [&](const key_value& a, const key_value& b) {
        if (group[a.value] != group[b.value]) return std::less<const int*>()(group[a.value], group[b.value]);
        return a.key < b.key;
      });
      std::vector<key_value> scratch;
      stable_sort_by_group_and_key(items, scratch, group_of);
      SCOPED_TRACE(testing::Message() << "n " << n << " groups " << groups);
      expect_same(items, want);
    }
  }
}

}  // namespace
}  // namespace gdskit
