#include "common/key_sort.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>

namespace gdskit {

namespace {
constexpr unsigned k_digit_bits = 11;
constexpr std::size_t k_buckets = std::size_t{1} << k_digit_bits;
// Below this many items a comparison sort is as fast and needs no counts.
constexpr std::size_t k_small = 256;

bool key_less(const key_value& a, const key_value& b) noexcept { return a.key < b.key; }
}  // namespace

void stable_sort_by_key(std::vector<key_value>& items, std::vector<key_value>& scratch) {
  const std::size_t n = items.size();
  if (n < 2 || std::is_sorted(items.begin(), items.end(), key_less)) return;
  if (n < k_small) {
    std::stable_sort(items.begin(), items.end(), key_less);
    return;
  }
  // Digits of the keys less their least: only the bits in which keys differ need passes.
  std::uint64_t lo = UINT64_MAX, hi = 0;
  for (const key_value& x : items) {
    lo = std::min(lo, x.key);
    hi = std::max(hi, x.key);
  }
  const auto bits = static_cast<unsigned>(std::bit_width(hi - lo));
  scratch.resize(n);
  key_value* src = items.data();
  key_value* dst = scratch.data();
  std::array<std::size_t, k_buckets> at{};
  for (unsigned shift = 0; shift < bits; shift += k_digit_bits) {
    auto digit = [&](const key_value& x) { return static_cast<std::size_t>(((x.key - lo) >> shift) & (k_buckets - 1)); };
    at.fill(0);
    for (std::size_t i = 0; i < n; ++i) ++at[digit(src[i])];
    if (at[digit(src[0])] == n) continue;  // every key has this digit: the order stands
    std::size_t sum = 0;
    for (std::size_t& c : at) {
      const std::size_t k = c;
      c = sum;
      sum += k;
    }
    for (std::size_t i = 0; i < n; ++i) dst[at[digit(src[i])]++] = src[i];
    std::swap(src, dst);
  }
  if (src != items.data()) items.swap(scratch);
}

void stable_sort_by_key(std::vector<key_value>& items) {
  std::vector<key_value> scratch;
  stable_sort_by_key(items, scratch);
}

}  // namespace gdskit
