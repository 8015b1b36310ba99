#include "gdskit/checksum.hpp"

#include <array>
#include <cstring>

namespace gdskit {
namespace {

constexpr std::uint32_t k_poly = 0x82F63B78u;  // Castagnoli, reflected

// Eight tables: slicing by 8 bytes at a time.
struct tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  constexpr tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) != 0 ? k_poly : 0u);
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
constexpr tables k_tables{};

std::uint32_t crc_tables(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  const auto& t = k_tables.t;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
// The SSE4.2 crc32 instruction, eight bytes at a time (several GiB/s per core: far above what one request of
// storage delivers).
__attribute__((target("sse4.2"))) std::uint32_t crc_hw(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c64);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

// Three lanes at once: the crc32 instruction takes three cycles but starts one per cycle, so three
// independent streams over three consecutive lanes of k_lane bytes run about three times as fast as one. The
// lanes are then joined: the register after lane A, carried over the k_lane bytes of lane B, is the register
// after A and B when B's own stream started from 0 (the register is linear in its start over any bytes).
constexpr std::size_t k_lane = 8192;

// The register carried over k_lane zero bytes, a linear map of its 32 bits, one table per byte of it.
struct lane_shift {
  std::uint32_t t[4][256];
  lane_shift() noexcept {
    static const unsigned char zeros[k_lane] = {};
    std::uint32_t basis[32];
    for (int i = 0; i < 32; ++i) basis[i] = crc_hw(zeros, k_lane, 1u << i);
    for (int j = 0; j < 4; ++j) {
      for (unsigned b = 0; b < 256; ++b) {
        std::uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if ((b >> bit) & 1u) v ^= basis[8 * j + bit];
        }
        t[j][b] = v;
      }
    }
  }
  std::uint32_t operator()(std::uint32_t c) const noexcept {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) std::uint32_t crc_hw3(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  if (n < 3 * k_lane) return crc_hw(p, n, c);
  static const lane_shift shift;
  while (n >= 3 * k_lane) {
    std::uint64_t a = c, b = 0, d = 0;
    for (std::size_t i = 0; i < k_lane; i += 8) {
      std::uint64_t va, vb, vd;
      std::memcpy(&va, p + i, 8);
      std::memcpy(&vb, p + k_lane + i, 8);
      std::memcpy(&vd, p + 2 * k_lane + i, 8);
      a = __builtin_ia32_crc32di(a, va);
      b = __builtin_ia32_crc32di(b, vb);
      d = __builtin_ia32_crc32di(d, vd);
    }
    c = shift(shift(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b)) ^ static_cast<std::uint32_t>(d);
    p += 3 * k_lane;
    n -= 3 * k_lane;
  }
  return crc_hw(p, n, c);
}

bool have_hw() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_hw()) return ~crc_hw3(p, nbytes, c);
#endif
  return ~crc_tables(p, nbytes, c);
}

}  // namespace gdskit
