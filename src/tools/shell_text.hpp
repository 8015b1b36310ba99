// Text that goes into generated shell scripts and path arguments given on the command line.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <system_error>

#include "common/printable.hpp"  // printable(): the tools escape what they show with the core's rule

namespace gdskit {

/// What a command prints for an exception that ended it, escaped exactly once: a gdskit::error's message is
/// escaped already (the library escapes the path and the names from files it puts in one), any other
/// exception's message is escaped here. Never printable(e.what()) of a gdskit::error: that escapes twice.
std::string shown_message(const std::exception& e);

/// `s` as one POSIX shell word in single quotes ('it'\''s'). Safe for any bytes except control characters,
/// which callers refuse first (has_control_chars): a newline inside quotes would break a commented line.
std::string shell_quote(std::string_view s);

/// Whether `s` holds an ASCII control character (0x00-0x1f or 0x7f), newline and tab included.
bool has_control_chars(std::string_view s) noexcept;

/// Checks a folder given on the command line: EINVAL when it holds control characters, ENOENT when it does
/// not exist, ENOTDIR when it is not a folder. Empty error when it is usable.
std::error_code check_folder_argument(const std::string& path);

/// The message for a check_folder_argument error ("does not exist", "is not a folder", ...).
std::string folder_argument_problem(std::error_code ec);

}  // namespace gdskit
