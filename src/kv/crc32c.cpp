#include "kv/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

#include "gdskit/kv.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace gdskit::kv {
namespace detail {
namespace {

constexpr std::uint32_t reflected_poly = 0x82F63B78u;

// tables[0] is the byte-at-a-time table; tables[k][b] is the CRC of byte b followed by k zero bytes, so eight
// lookups advance eight bytes at once.
struct slicing_tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  constexpr slicing_tables() {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1u) != 0 ? (c >> 1) ^ reflected_poly : c >> 1;
      t[0][b] = c;
    }
    for (std::size_t k = 1; k < 8; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    }
  }
};
constexpr slicing_tables tables;

std::uint64_t load_le64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// The register update without the inversions at either end (crc32c() adds them).
std::uint32_t raw_portable(std::uint32_t s, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = tables.t;
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    s = (s >> 8) ^ t[0][(s ^ *p++) & 0xffu];
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint64_t w = load_le64(p);
    const std::uint32_t lo = s ^ static_cast<std::uint32_t>(w);
    const std::uint32_t hi = static_cast<std::uint32_t>(w >> 32);
    s = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
  }
  while (n-- > 0) s = (s >> 8) ^ t[0][(s ^ *p++) & 0xffu];
  return s;
}

#if defined(__x86_64__)
// Product of two polynomials modulo the CRC polynomial, in the reflected bit order (bit 31 is x^0).
std::uint32_t multiply_mod(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if ((a & (0x80000000u >> i)) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ reflected_poly : b >> 1;
  }
  return product;
}

// x^(8n) mod P: the factor that moves a register value past n more bytes (the update of the polynomial 1,
// which is 0x80000000 reflected, over n zero bytes).
std::uint32_t shift_factor(std::size_t n) noexcept {
  static const std::array<unsigned char, 4096> zeros{};
  std::uint32_t s = 0x80000000u;
  for (; n >= zeros.size(); n -= zeros.size()) s = raw_portable(s, zeros.data(), zeros.size());
  return raw_portable(s, zeros.data(), n);
}

// Three streams of `stride` bytes each are run side by side (the instruction's latency is three times its
// issue rate), then joined: state(A B C) = shift(a, 2 stride) ^ shift(b, stride) ^ c.
struct stride_factors {
  std::size_t stride;
  std::uint32_t one, two;  // shift factors for stride and 2 x stride bytes
};

const std::array<stride_factors, 2>& strides() {
  static const std::array<stride_factors, 2> s = [] {
    std::array<stride_factors, 2> out{};
    const std::size_t sizes[2] = {8192, 256};
    for (int i = 0; i < 2; ++i) out[i] = {sizes[i], shift_factor(sizes[i]), shift_factor(2 * sizes[i])};
    return out;
  }();
  return s;
}

__attribute__((target("sse4.2"))) std::uint32_t raw_instruction(std::uint32_t s, const unsigned char* p,
                                                                 std::size_t n) noexcept {
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    s = _mm_crc32_u8(s, *p++);
    --n;
  }
  for (const stride_factors& f : strides()) {
    while (n >= 3 * f.stride) {
      std::uint64_t a = s, b = 0, c = 0;
      const unsigned char* pa = p;
      const unsigned char* pb = p + f.stride;
      const unsigned char* pc = p + 2 * f.stride;
      for (std::size_t i = 0; i < f.stride; i += 8) {
        a = _mm_crc32_u64(a, load_le64(pa + i));
        b = _mm_crc32_u64(b, load_le64(pb + i));
        c = _mm_crc32_u64(c, load_le64(pc + i));
      }
      s = multiply_mod(static_cast<std::uint32_t>(a), f.two) ^ multiply_mod(static_cast<std::uint32_t>(b), f.one) ^
          static_cast<std::uint32_t>(c);
      p += 3 * f.stride;
      n -= 3 * f.stride;
    }
  }
  std::uint64_t s64 = s;
  for (; n >= 8; n -= 8, p += 8) s64 = _mm_crc32_u64(s64, load_le64(p));
  s = static_cast<std::uint32_t>(s64);
  while (n-- > 0) s = _mm_crc32_u8(s, *p++);
  return s;
}
#endif

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  return ~raw_portable(~crc, static_cast<const unsigned char*>(data), nbytes);
}

std::uint32_t crc32c_instruction(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
#if defined(__x86_64__)
  return ~raw_instruction(~crc, static_cast<const unsigned char*>(data), nbytes);
#else
  return crc32c_portable(data, nbytes, crc);
#endif
}

bool crc32c_hardware() noexcept {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2") != 0;
  return has;
#else
  return false;
#endif
}

}  // namespace detail

std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  return detail::crc32c_hardware() ? detail::crc32c_instruction(data, nbytes, crc)
                                   : detail::crc32c_portable(data, nbytes, crc);
}

}  // namespace gdskit::kv
