// A view of a machine's state for the doctor: either the live system or a captured folder shaped like /
// (proc, sys, etc, run) with command outputs under commands/. Every read is recorded, so a capture holds
// exactly what the checks looked at.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "posix/in_root.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::doctor {

/// Text of one file or command output, or why it could not be read. Never throws.
struct read_result {
  std::optional<std::string> text;
  std::error_code error;  // set when `text` is empty
  bool capped = false;    // the file was longer than the limit: `text` holds its first bytes
  std::string why;        // explanation beyond `error` ("not a regular file (FIFO)"), may be empty
  bool ok() const noexcept { return text.has_value(); }
  std::string reason() const { return why.empty() ? error.message() : why; }
};

/// Where a piece of evidence came from: a path relative to the root ("proc/modules") or a command
/// ("commands/dmesg.txt"), and optionally the 1-based line.
struct source_ref {
  std::string file;
  int line = 0;
  std::string text;  // the line's content (trimmed), empty for "file absent" evidence
};

class system_root {
 public:
  /// `root` is "/" for the live system; anything else is treated as a capture (commands come from
  /// root/commands/<name>.txt and symlinks from <path>.link or <dir>/realpath.txt files).
  explicit system_root(std::filesystem::path root, bool live);

  /// Live system rooted at "/".
  static system_root live_system() { return system_root("/", true); }
  /// A captured folder.
  static system_root captured(std::filesystem::path root) { return system_root(std::move(root), false); }

  bool live() const noexcept { return live_; }
  const std::filesystem::path& root() const noexcept { return root_; }

  /// Reads a text file given relative to the root ("proc/cmdline"). Only regular files are read (a FIFO,
  /// device or socket is an error, never a wait); files larger than `max_bytes` are cut and listed in capped().
  read_result read(const std::string& rel, std::size_t max_bytes = 1 << 20);
  /// Reads a file and keeps only lines containing one of `needles`; only those lines are recorded
  /// (how /proc/kallsyms, many MiB, is read and captured). At most max_scan_bytes are scanned.
  read_result grep(const std::string& rel, const std::vector<std::string>& needles);
  /// Entry names of a folder, sorted; error when absent or unreadable. In a capture an entry "X.link" is the
  /// link X of the captured machine and is listed as X. With `record_links`, every entry that is a link is
  /// recorded as "<rel>/X.link" holding its target (how sysfs slaves and holders folders reach a capture).
  std::vector<std::string> list(const std::string& rel, std::error_code& ec, bool record_links = false);
  /// Whether a path (or, in a capture, the link X.link standing for it) exists; not recorded.
  bool exists(const std::string& rel) const;
  /// Target of a symlink (live: readlink; capture: the text of <rel>.link).
  read_result link_target(const std::string& rel);
  /// Absolute resolved path of a sysfs folder as seen on the captured machine ("/sys/devices/pci0000:00/...")
  /// (live: canonical path; capture: <rel>/realpath.txt).
  read_result real_path(const std::string& rel);
  /// Output of a command by capture name ("dmesg", "uname", "iommu_groups", "run-udev-data", "ulimit-l",
  /// "nvidia-smi-q", "ls-sys-bus-pci-devices", "cufile-log", "doctor-path"): live, the doctor produces it
  /// itself (running the program where needed, found by absolute path: programs_not_found()); capture,
  /// root/commands/<name>.txt.
  read_result command(const std::string& name);

  /// Files (relative to the root) whose reading stopped at a size limit, in the order met.
  const std::vector<std::string>& capped() const noexcept { return capped_; }

  /// A program the live doctor would have run but did not find (programs are run by absolute path from the
  /// system folders, tools::find_program; $PATH is never searched), and where it was looked for.
  struct missing_program {
    std::string name;
    std::string searched;
  };
  /// The programs not found so far, in the order met.
  const std::vector<missing_program>& programs_not_found() const noexcept { return not_found_; }

  /// Most bytes grep() scans, and the longest line it keeps.
  static constexpr std::size_t max_scan_bytes = 256u << 20;
  static constexpr std::size_t max_line_bytes = 4096;

  /// Everything read so far: path relative to root -> recorded content (command outputs under commands/).
  const std::map<std::string, std::string>& recorded() const noexcept { return recorded_; }
  /// Adds a synthetic record (used for command outputs produced by the caller).
  void record(const std::string& rel, std::string content) { recorded_[rel] = std::move(content); }

 private:
  std::filesystem::path abs(const std::string& rel) const;
  read_result live_command(const std::string& name);
  // Runs `program` found in the system folders; records it in not_found_ when it is not there.
  read_result run_found(const char* program, const std::vector<std::string>& args);

  std::filesystem::path root_;
  bool live_;
  // Captured roots read through open_in_root: no link can lead a read outside the root.
  posix::root_files files_;
  std::vector<missing_program> not_found_;
  std::map<std::string, std::string> recorded_;
  std::vector<std::string> capped_;
  void note_capped(const std::string& rel);
};

/// Splits text into lines (no trailing '\n'; a final line without newline is kept).
std::vector<std::string> split_lines(const std::string& text);
/// Trims ASCII whitespace at both ends.
std::string trim(std::string s);

}  // namespace gdskit::doctor
