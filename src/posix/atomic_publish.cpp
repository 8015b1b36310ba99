#include "posix/atomic_publish.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "common/printable.hpp"
#include "gdskit/error.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::posix {
namespace {

std::filesystem::path folder_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

std::string random_suffix() {
  static thread_local std::mt19937_64 gen{std::random_device{}() ^ static_cast<std::uint64_t>(::getpid())};
  return fmt::format("{:016x}", gen());
}

bool exists_no_follow(const std::filesystem::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// rename without replacing: renameat2(RENAME_NOREPLACE), or link + unlink where the file system lacks it.
int rename_noreplace(const char* from, const char* to) {
  if (sys().rename(from, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;
  if (sys().link(from, to) != 0) return -1;
  sys().unlink(from);
  return 0;
}

}  // namespace

atomic_publish::atomic_publish(std::filesystem::path target, bool overwrite)
    : target_(std::move(target)), overwrite_(overwrite) {
  if (!overwrite_ && exists_no_follow(target_)) {
    throw error(errno_code(EEXIST), "create", target_.string(), -1, 0, "overwrite not set");
  }
  temp_ = folder_of(target_) / fmt::format("{}.gdskit-tmp.{}", target_.filename().string(), random_suffix());
}

atomic_publish::~atomic_publish() { discard(); }

atomic_publish::atomic_publish(atomic_publish&& o) noexcept
    : target_(std::move(o.target_)),
      temp_(std::exchange(o.temp_, {})),
      overwrite_(o.overwrite_),
      committed_(std::exchange(o.committed_, false)) {}

atomic_publish& atomic_publish::operator=(atomic_publish&& o) noexcept {
  if (this != &o) {
    discard();
    target_ = std::move(o.target_);
    temp_ = std::exchange(o.temp_, {});
    overwrite_ = o.overwrite_;
    committed_ = std::exchange(o.committed_, false);
  }
  return *this;
}

void atomic_publish::discard() noexcept {
  if (committed_ || temp_.empty()) return;
  sys().unlink(temp_.c_str());
  temp_.clear();
}

void atomic_publish::sync_data(int fd) const {
  if (fd >= 0 && sys().fdatasync(fd) != 0) throw error(errno_code(errno), "fdatasync", temp_.string(), -1, 0);
}

void atomic_publish::rename() {
  const int r = overwrite_ ? sys().rename(temp_.c_str(), target_.c_str(), 0)
                           : rename_noreplace(temp_.c_str(), target_.c_str());
  if (r != 0) {
    const int e = errno;
    throw error(errno_code(e), "rename", temp_.string(), -1, 0, fmt::format("to {}", printable(target_.string())));
  }
  committed_ = true;
}

void atomic_publish::rename_and_sync_folder() {
  rename();
  // The rename is durable only once the folder's entry is on disk.
  sync_folder(folder_of(target_));
}

void atomic_publish::commit(int fd) {
  sync_data(fd);
  rename_and_sync_folder();
}

void sync_folder(const std::filesystem::path& folder) {
  std::error_code ec;
  unique_fd dfd(open_retry(folder.c_str(), O_RDONLY | O_DIRECTORY, 0, ec));
  if (!dfd) throw error(ec, "open folder", folder.string(), -1, 0);
  if (sys().fsync(dfd.get()) != 0) throw error(errno_code(errno), "fsync folder", folder.string(), -1, 0);
}

atomic_publish write_unpublished(const std::filesystem::path& target, std::string_view data, mode_t mode,
                                 bool overwrite) {
  atomic_publish pub(target, overwrite);
  std::error_code ec;
  unique_fd fd(open_retry(pub.temp_path().c_str(), O_WRONLY | O_CREAT | O_EXCL, mode, ec));
  if (!fd) throw error(ec, "create temporary file", pub.temp_path().string(), -1, 0);
  pwrite_full(fd.get(), data.data(), data.size(), 0, ec);
  if (ec) throw error(ec, "write temporary file", pub.temp_path().string(), 0, data.size());
  // The umask may have narrowed the mode given to open.
  if (::fchmod(fd.get(), mode) != 0) throw error(errno_code(errno), "fchmod", pub.temp_path().string(), -1, 0);
  pub.sync_data(fd.get());
  return pub;
}

void atomic_write_file(const std::filesystem::path& target, std::string_view data, mode_t mode, bool overwrite) {
  write_unpublished(target, data, mode, overwrite).rename_and_sync_folder();
}

}  // namespace gdskit::posix
