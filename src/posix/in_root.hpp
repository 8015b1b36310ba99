// Files of a system root: the live machine ("/") or a folder shaped like / captured from another machine, whose
// content, links included, is not trusted. Under a captured root every path is resolved inside the folder, one
// component at a time, so no link can make a read land outside it. The doctor and the planner read through here.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "posix/bounded_read.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::posix {

/// Opens `rel` under the folder `root` as the captured machine would see it: every component is resolved
/// inside `root` (".." stops at it), symbolic links are followed only while they stay inside (a relative target
/// that climbs above `root`, or any absolute target, is refused with EACCES and `why` saying so), at most 40 of
/// them. The last component is opened with `flags` | O_NOFOLLOW | O_CLOEXEC. Returns no fd with `ec` set on
/// failure. Never throws.
unique_fd open_in_root(const std::filesystem::path& root, std::string_view rel, int flags, std::error_code& ec,
                       std::string& why) noexcept;

/// The path `rel` names under `root` once every link on the way, the last component's too, is followed inside
/// `root` (same rules as open_in_root), relative to `root` ("" for the root itself). The path must exist. Never
/// throws; nullopt with `ec` (and `why` for a refused link) on failure.
std::optional<std::string> resolve_in_root(const std::filesystem::path& root, std::string_view rel,
                                           std::error_code& ec, std::string& why) noexcept;

/// Reads under a system root. Live ("/"): paths are read as they are and links followed as the kernel follows
/// them. Captured: every path goes through open_in_root. Reads are bounded as read_bounded's (regular files
/// only, never blocking on a FIFO or device, at most the stated bytes). `rel` is relative to the root (a leading
/// '/' is ignored). No member throws except scan_lines, which passes on what `on_line` throws.
class root_files {
 public:
  root_files(std::filesystem::path root, bool live) : root_(std::move(root)), live_(live) {}
  /// "/" is the live machine; any other folder a captured root.
  explicit root_files(const std::filesystem::path& root) : root_files(root, root == "/") {}

  bool live() const noexcept { return live_; }
  const std::filesystem::path& root() const noexcept { return root_; }

  /// At most `max_bytes` of a regular file (the last ones with `tail`), as read_bounded.
  bounded_text read(std::string_view rel, std::size_t max_bytes, bool tail = false) const;
  /// The lines of a regular file, as scan_lines_bounded.
  bounded_text scan_lines(std::string_view rel, std::size_t max_total_bytes, std::size_t max_line_bytes,
                          const std::function<void(std::string_view)>& on_line) const;
  /// Whether `rel` exists (links followed inside the root; a dangling or refused link does not exist).
  bool exists(std::string_view rel) const;
  /// Whether `rel` is a folder (links followed as for exists).
  bool is_directory(std::string_view rel) const;
  /// `rel` with every link followed (resolve_in_root; live: the canonical path), relative to the root.
  std::optional<std::string> resolve(std::string_view rel) const;
  /// Entry names of the folder `rel`, unsorted, at most `max_entries` of them (a hostile root's folder may hold
  /// millions); `ec` set when it cannot be read.
  std::vector<std::string> list(std::string_view rel, std::error_code& ec, std::size_t max_entries = 100000) const;

 private:
  std::filesystem::path abs(std::string_view rel) const;
  unique_fd open(std::string_view rel, int flags, bounded_text& failed) const;

  std::filesystem::path root_;
  bool live_;
};

}  // namespace gdskit::posix
