// Replacing a driver source file so that a crash at any point leaves either the old or the new bytes, never a mix.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <random>

#include <fmt/format.h>

#include "gdskit/error.hpp"
#include "patch/patch.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::patch {
namespace {

std::mutex hook_mutex;
before_rename_hook& hook() {
  static before_rename_hook h;
  return h;
}

std::string temp_name(const std::filesystem::path& target) {
  std::random_device rd;
  return fmt::format("{}.gdskit-tmp.{:08x}", target.filename().string(), rd());
}

}  // namespace

void set_before_rename_hook(before_rename_hook h) {
  std::lock_guard lock(hook_mutex);
  hook() = std::move(h);
}

void atomic_write(const std::filesystem::path& target, std::string_view data) {
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::filesystem::path tmp = dir / temp_name(target);
  mode_t mode = 0644;
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) mode = st.st_mode & 07777;

  std::error_code ec;
  posix::unique_fd fd(posix::open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode, ec));
  if (!fd) throw error(ec, "create temporary file", tmp.string(), -1, 0);
  auto fail = [&](std::error_code code, std::string_view op) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw error(code, op, tmp.string(), -1, 0, fmt::format("replacing {}", target.string()));
  };
  posix::pwrite_full(fd.get(), data.data(), data.size(), 0, ec);
  if (ec) fail(ec, "write temporary file");
  // The umask may have narrowed the mode given to open; the replacement keeps the original's mode.
  if (::fchmod(fd.get(), mode) != 0) fail(errno_code(errno), "fchmod temporary file");
  if (posix::sys().fdatasync(fd.get()) != 0) fail(errno_code(errno), "fsync temporary file");
  fd.reset();

  before_rename_hook h;
  {
    std::lock_guard lock(hook_mutex);
    h = hook();
  }
  if (h) {
    try {
      h(tmp, target);
    } catch (const simulated_kill&) {
      throw;  // a killed process removes nothing
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw error(errno_code(e), "rename", tmp.string(), -1, 0, fmt::format("to {}", target.string()));
  }
  // The rename is durable only once the folder's entry is on disk.
  posix::unique_fd dfd(posix::open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, ec));
  if (dfd) posix::sys().fdatasync(dfd.get());
}

}  // namespace gdskit::patch
