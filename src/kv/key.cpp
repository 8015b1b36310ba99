// Keys and the small enums of the public header.
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"

namespace gdskit::kv {

key key::from_bytes(std::span<const std::uint8_t> bytes) {
  if (bytes.empty() || bytes.size() > 32) {
    throw error(errno_code(EINVAL),
                fmt::format("kv key: {} bytes; a byte key holds 1 to 32 bytes (a block hash)", bytes.size()));
  }
  key k;
  k.kind_ = static_cast<std::uint8_t>(kind::bytes);
  k.size_ = static_cast<std::uint8_t>(bytes.size());
  if (!bytes.empty()) std::memcpy(k.bytes_.data(), bytes.data(), bytes.size());
  return k;
}

key key::from_bytes(std::string_view bytes) {
  return from_bytes(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
}

key key::from_magnitude(std::span<const std::uint8_t> magnitude_le, bool negative) {
  std::size_t n = magnitude_le.size();
  while (n > 0 && magnitude_le[n - 1] == 0) --n;
  if (n > 32) throw error(errno_code(EINVAL), "kv key: an integer key must be below 2^256 in magnitude");
  key k;
  k.kind_ = static_cast<std::uint8_t>(negative && n > 0 ? kind::negative_integer : kind::integer);
  k.size_ = static_cast<std::uint8_t>(n);
  if (n > 0) std::memcpy(k.bytes_.data(), magnitude_le.data(), n);
  return k;
}

key key::from_uint(std::uint64_t value) noexcept {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(value >> (8 * i));
  return from_magnitude(b, false);
}

key key::from_int(std::int64_t value) noexcept {
  // The magnitude of INT64_MIN does not fit in int64_t; it does in uint64_t.
  const std::uint64_t magnitude = value < 0 ? ~static_cast<std::uint64_t>(value) + 1 : static_cast<std::uint64_t>(value);
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(magnitude >> (8 * i));
  return from_magnitude(b, value < 0);
}

std::uint64_t key::hash() const noexcept {
  // FNV-1a over the identity, then a finaliser so that small integers spread over every bit.
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint8_t b) {
    h ^= b;
    h *= 0x100000001b3ull;
  };
  mix(kind_);
  mix(size_);
  for (std::size_t i = 0; i < size_; ++i) mix(bytes_[i]);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::string key::to_string() const {
  std::string hex;
  if (type() == kind::bytes) {
    for (std::size_t i = 0; i < size_; ++i) hex += fmt::format("{:02x}", bytes_[i]);
    return "0x" + hex;
  }
  for (std::size_t i = size_; i > 0; --i) hex += fmt::format("{:02x}", bytes_[i - 1]);
  if (hex.empty()) hex = "0";
  switch (type()) {
    case kind::integer: return "int:0x" + hex;
    case kind::negative_integer: return "int:-0x" + hex;
    default: return "(no key)";
  }
}

std::string_view to_string(durability d) noexcept { return d == durability::persist ? "persist" : "cache"; }
std::string_view to_string(admission a) noexcept { return a == admission::second_hit ? "second_hit" : "always"; }

}  // namespace gdskit::kv
