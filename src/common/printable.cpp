#include "common/printable.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace gdskit {
namespace {

// The code point of the well-formed sequence of `len` bytes at s.
std::uint32_t code_point(const unsigned char* s, std::size_t len) noexcept {
  if (len == 1) return s[0];
  std::uint32_t cp = s[0] & (0x7Fu >> len);
  for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[k] & 0x3Fu);
  return cp;
}

}  // namespace

std::size_t utf8_length_at(const unsigned char* s, std::size_t n, std::size_t i) noexcept {
  const unsigned c = s[i];
  if (c < 0x80) return 1;
  std::size_t len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > n) return 0;
  if (s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
  }
  return len;
}

std::string printable(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::string out;
  out.reserve(n);
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    const std::size_t len = utf8_length_at(s, n, i);
    if (len == 0) {
      out += fmt::format("\\x{:02x}", c);  // not UTF-8: the byte itself
      ++i;
      continue;
    }
    if (len == 1) {
      switch (c) {
        case '\\': out += "\\\\"; break;
        case '\a': out += "\\a"; break;
        case '\b': out += "\\b"; break;
        case '\t': out += "\\t"; break;
        case '\n': out += "\\n"; break;
        case '\v': out += "\\v"; break;
        case '\f': out += "\\f"; break;
        case '\r': out += "\\r"; break;
        default:
          if (c < 0x20 || c == 0x7F) {
            out += fmt::format("\\x{:02x}", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // C1 controls (U+0080..U+009F: some terminals take U+009B as CSI) and the bidirectional overrides, which
    // reorder what a reader sees, are written as code points.
    const std::uint32_t cp = code_point(s + i, len);
    if (cp <= 0x9F || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
        (cp >= 0x2066 && cp <= 0x2069)) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

}  // namespace gdskit
