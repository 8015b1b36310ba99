// Text from outside (file contents, paths, names from an index) made safe to show in a message or a report.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gdskit {

/// `s` made safe for one-line messages, comments and reports: control bytes become C escapes (\n, \t, \x1b,
/// ...), a backslash becomes \\, bytes that are not UTF-8 become \xNN, and C1 controls and bidirectional
/// overrides become \uNNNN; printable UTF-8 is kept. One rule for every name or path that came from outside
/// (safetensors::printable_name is this function).
std::string printable(std::string_view s);

/// The length of the well-formed UTF-8 sequence that starts at s[i] (1-4), or 0 when the bytes there are not
/// one (overlong forms, surrogates and code points above U+10FFFF are not). Precondition: i < n.
std::size_t utf8_length_at(const unsigned char* s, std::size_t n, std::size_t i) noexcept;

}  // namespace gdskit
