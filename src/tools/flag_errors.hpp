// Flag errors in gdskit's words: the checks every numeric or one-of flag gets, and what the parser's own errors
// (a flag given twice, a flag without its value, a value it could not convert) say instead of its wording.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace gdskit::tools {

/// The message for a parse error of `cmd` (the innermost command the line reached; the flags of the commands
/// above it are searched too): the flag with all its names, what was wrong, and what it takes.
///   -s given twice (4G, 5G); it takes one value
///   -w needs a value: THREADS
///   -o/--offset: '-1' is out of range (0 .. 9223372036854775807)
/// Text without user values escaped: the printer escapes the whole message once. Errors that are not about one
/// flag (a required flag missing, two flags that exclude each other) keep the parser's text.
std::string usage_message(const CLI::App& cmd, const CLI::ParseError& e);

/// Accepts a whole number from `lo` to `hi` in decimal ("+" and leading zeros are taken, hex and exponents are
/// not) and passes it on in plain decimal. Otherwise "'VALUE' is not a whole number", or "'VALUE' is out of
/// range (LO .. HI)".
CLI::Validator whole_number(std::int64_t lo, std::uint64_t hi);

/// whole_number over the range of T (the type of the variable the flag writes).
template <class T>
CLI::Validator whole_number() {
  return whole_number(static_cast<std::int64_t>(std::numeric_limits<T>::min()),
                      static_cast<std::uint64_t>(std::numeric_limits<T>::max()));
}

/// Accepts a finite decimal number ("0.5", "3", "1e-3"); anything else (nan, inf, words) is "'VALUE' is not a
/// number". Ranges are the command's to check.
CLI::Validator real_number();

/// Accepts one of `names` exactly; anything else is "'VALUE' is not one of a, b, c".
CLI::Validator one_of(std::vector<std::string> names);

}  // namespace gdskit::tools
