// The verification pattern: a function of (seed, file offset), so any request at any offset, in any order and
// from any worker, writes the same bytes there, and a read anywhere knows what it must see.
#include <cstring>

#include "bench/bench.hpp"

namespace gdskit::bench {

namespace {

std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t word(std::uint64_t seed, std::uint64_t index) noexcept { return mix(seed * 0x100000001b3ULL ^ index); }

}  // namespace

std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t offset) noexcept {
  return static_cast<std::uint8_t>(word(seed, offset / 8) >> (8 * (offset % 8)));
}

void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::byte* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  while (i < n && (offset + i) % 8 != 0) {
    dst[i] = std::byte{pattern_byte(seed, offset + i)};
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = word(seed, (offset + i) / 8);
    // Little-endian byte order, the same as pattern_byte.
    for (int b = 0; b < 8; ++b) dst[i + b] = std::byte{static_cast<std::uint8_t>(w >> (8 * b))};
  }
  for (; i < n; ++i) dst[i] = std::byte{pattern_byte(seed, offset + i)};
}

std::optional<std::size_t> check_pattern(std::uint64_t seed, std::uint64_t offset, const std::byte* data,
                                         std::size_t n) noexcept {
  std::byte expect[4096];
  for (std::size_t done = 0; done < n; done += sizeof expect) {
    std::size_t len = std::min(sizeof expect, n - done);
    fill_pattern(seed, offset + done, expect, len);
    if (std::memcmp(expect, data + done, len) != 0) {
      for (std::size_t k = 0; k < len; ++k) {
        if (expect[k] != data[done + k]) return done + k;
      }
    }
  }
  return std::nullopt;
}

}  // namespace gdskit::bench
