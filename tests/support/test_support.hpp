// Shared test fixtures: a temporary folder, random data, a settings guard.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gdskit/file.hpp"
#include "gdskit/settings.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::test {

/// Whether this program runs under AddressSanitizer or ThreadSanitizer: tests that repeat the same check many
/// times (random kill points, a million ranges) repeat it fewer times there, where each costs several times
/// as much and finds the same memory and thread faults; the optimised build runs them all.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

/// A fresh folder under $TMPDIR (or `parent`), removed with its contents at destruction.
class temp_dir {
 public:
  explicit temp_dir(const std::filesystem::path& parent = {});
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Deterministic random bytes (seeded) so a failure can be replayed.
std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed);
/// Writes `data` to `path` with plain stdio (the reference, independent of gdskit).
void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& data);
/// Writes `data` to `path` and opens it for reading through the thread engine without O_DIRECT, so that every
/// read of it goes through the syscall seam's pread.
file_handle open_for_seam(const std::filesystem::path& path, const std::vector<std::uint8_t>& data);
/// Writes `text` to `path`, creating the folders above it.
void write_text(const std::filesystem::path& path, const std::string& text);
/// Reads the whole file with plain pread (the reference).
std::vector<std::uint8_t> read_file(const std::filesystem::path& path);

/// Restores the process-wide settings (values and sources) at destruction.
class settings_guard {
 public:
  settings_guard() : saved_(save_settings()) {}
  ~settings_guard() { restore_settings(saved_); }

 private:
  settings_state saved_;
};

/// A folder on a file system that accepts O_DIRECT (tests' temp folder), and one that refuses it (/dev/shm),
/// empty when none exists here.
std::filesystem::path direct_capable_parent();
/// The real system calls, except that every pread, pwrite, ftruncate and io_uring completion adds one to
/// `calls` (for tests that prove a request never reached the file).
posix::syscall_table counting_syscalls(std::atomic<int>& calls);
/// The real system calls, except that every pread first sleeps for `hold(offset)`: a slow device, or one slow
/// read among fast ones.
posix::syscall_table slow_preads(std::function<std::chrono::nanoseconds(off_t offset)> hold);
std::filesystem::path direct_refusing_parent();

}  // namespace gdskit::test
