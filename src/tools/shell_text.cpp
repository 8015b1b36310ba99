#include "tools/shell_text.hpp"

#include <filesystem>

#include "gdskit/error.hpp"

namespace gdskit {

std::string shown_message(const std::exception& e) {
  if (dynamic_cast<const error*>(&e) != nullptr) return e.what();
  return printable(e.what());
}

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

bool has_control_chars(std::string_view s) noexcept {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

std::error_code check_folder_argument(const std::string& path) {
  if (path.empty() || has_control_chars(path)) return std::make_error_code(std::errc::invalid_argument);
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) return std::make_error_code(std::errc::no_such_file_or_directory);
  if (!std::filesystem::is_directory(st)) return std::make_error_code(std::errc::not_a_directory);
  return {};
}

std::string folder_argument_problem(std::error_code ec) {
  if (ec == std::errc::invalid_argument) return "empty, or holds control characters (newline, tab, ...)";
  if (ec == std::errc::no_such_file_or_directory) return "does not exist";
  if (ec == std::errc::not_a_directory) return "is not a folder";
  return ec.message();
}

}  // namespace gdskit
