// Reading files whose content and type are not trusted (captured system roots, driver source trees): never
// blocks on a FIFO or device, never reads more than a stated number of bytes, reads only regular files.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "posix/syscalls.hpp"

namespace gdskit {

/// Text read from a file, or why not. Never thrown; callers decide what an absent file means.
struct bounded_text {
  std::optional<std::string> text;  ///< unset when the file could not be read
  std::error_code error;            ///< set when `text` is unset
  bool capped = false;              ///< the file held more than the limit: `text` is its first bytes only
  std::string why;                  ///< a short explanation beyond `error` ("not a regular file (FIFO)"), may be empty
  bool ok() const noexcept { return text.has_value(); }
  /// `why` when set, else the error's message.
  std::string reason() const;
};

/// Reads at most `max_bytes` of `path`. Opens with O_NONBLOCK and O_NOCTTY, then checks with fstat that it is
/// a regular file (a FIFO, socket or device gives EINVAL, a folder EISDIR). Files of /proc and /sys are regular
/// files, so live system roots read normally. `tail` reads the last `max_bytes` instead of the first.
/// All I/O goes through the syscall seam. Never throws.
bounded_text read_bounded(const std::filesystem::path& path, std::size_t max_bytes, bool tail = false) noexcept;
/// The same for a descriptor the caller opened (O_NONBLOCK; how a file is found safely under a root is the
/// caller's business): checked to be a regular file, then read as above. Takes ownership of `fd`.
bounded_text read_bounded(posix::unique_fd fd, std::size_t max_bytes, bool tail = false) noexcept;

/// Calls `on_line` for each line of `path` (without the '\n'), reading at most `max_total_bytes`; lines
/// longer than `max_line_bytes` are passed cut to that length. Same open rules as read_bounded. On success
/// `text` is set to an empty string and `capped` says whether the limit stopped the scan. Never throws
/// (exceptions from `on_line` propagate).
bounded_text scan_lines_bounded(const std::filesystem::path& path, std::size_t max_total_bytes,
                                std::size_t max_line_bytes, const std::function<void(std::string_view)>& on_line);
/// The same for a descriptor the caller opened. Takes ownership of `fd`.
bounded_text scan_lines_bounded(posix::unique_fd fd, std::size_t max_total_bytes, std::size_t max_line_bytes,
                                const std::function<void(std::string_view)>& on_line);

}  // namespace gdskit
