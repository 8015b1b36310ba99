#include "posix/syscalls.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include "common/timespec.hpp"

#ifdef GDSKIT_HAVE_URING
#include <liburing.h>
#endif

namespace gdskit::posix {
namespace {

syscall_table make_real() {
  syscall_table t;
  t.open = [](const char* p, int f, mode_t m) { return ::open(p, f, m); };
  t.close = [](int fd) { return ::close(fd); };
  t.pread = [](int fd, void* b, std::size_t n, off_t o) { return ::pread(fd, b, n, o); };
  t.pwrite = [](int fd, const void* b, std::size_t n, off_t o) { return ::pwrite(fd, b, n, o); };
  t.fstat = [](int fd, struct stat* st) { return ::fstat(fd, st); };
  t.fstatfs = [](int fd, struct statfs* st) { return ::fstatfs(fd, st); };
  t.ftruncate = [](int fd, off_t n) { return ::ftruncate(fd, n); };
  t.fallocate = [](int fd, int mode, off_t o, off_t n) { return ::fallocate(fd, mode, o, n); };
  t.fdatasync = [](int fd) { return ::fdatasync(fd); };
  t.fadvise = [](int fd, off_t o, off_t n, int advice) { return ::posix_fadvise(fd, o, n, advice); };
  t.block_device_size = [](int fd, std::uint64_t* nbytes) { return ::ioctl(fd, BLKGETSIZE64, nbytes); };
  t.fsync = [](int fd) { return ::fsync(fd); };
  t.rename = [](const char* from, const char* to, unsigned flags) {
    return ::renameat2(AT_FDCWD, from, AT_FDCWD, to, flags);
  };
  t.link = [](const char* from, const char* to) { return ::link(from, to); };
  t.unlink = [](const char* p) { return ::unlink(p); };
  t.uring_result = [](bool, int, std::uint64_t, std::size_t, int result) { return result; };
#ifdef GDSKIT_HAVE_URING
  t.uring_submit_and_wait = [](void* ring, unsigned wait_nr) {
    return io_uring_submit_and_wait(static_cast<io_uring*>(ring), wait_nr);
  };
  t.uring_wait = [](void* ring) {
    io_uring_cqe* cqe = nullptr;
    return io_uring_wait_cqe(static_cast<io_uring*>(ring), &cqe);
  };
  t.uring_wait_for = [](void* ring, std::int64_t timeout_ns) {
    io_uring_cqe* cqe = nullptr;
    const timespec t = to_timespec(std::chrono::nanoseconds(timeout_ns));
    __kernel_timespec ts{t.tv_sec, t.tv_nsec};
    return io_uring_wait_cqe_timeout(static_cast<io_uring*>(ring), &cqe, &ts);
  };
#else
  t.uring_submit_and_wait = [](void*, unsigned) { return -ENOSYS; };
  t.uring_wait = [](void*) { return -ENOSYS; };
  t.uring_wait_for = [](void*, std::int64_t) { return -ENOSYS; };
#endif
  return t;
}

}  // namespace

const syscall_table& real_syscalls() noexcept {
  static const syscall_table table = make_real();
  return table;
}

namespace {

std::atomic<const syscall_table*>& current_table() noexcept {
  static std::atomic<const syscall_table*> current{&real_syscalls()};
  return current;
}

}  // namespace

const syscall_table& sys() noexcept { return *current_table().load(std::memory_order_acquire); }

scoped_syscalls::scoped_syscalls(syscall_table table) {
  static std::mutex m;
  static auto* installed = new std::deque<syscall_table>();  // never shrinks nor destroyed: see the header
  const syscall_table* t = nullptr;
  {
    std::lock_guard lock(m);
    t = &installed->emplace_back(std::move(table));
  }
  saved_ = current_table().exchange(t, std::memory_order_acq_rel);
}

scoped_syscalls::~scoped_syscalls() { current_table().store(saved_, std::memory_order_release); }

int open_retry(const char* path, int flags, mode_t mode, std::error_code& ec) noexcept {
  for (;;) {
    int fd = sys().open(path, flags | O_CLOEXEC, mode);
    if (fd >= 0) {
      ec.clear();
      return fd;
    }
    if (errno == EINTR) continue;
    ec = std::error_code(errno, std::generic_category());
    return -1;
  }
}

int open_without_waiting(const char* path, int flags, mode_t mode, struct stat& st, std::error_code& ec) noexcept {
  st = {};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int fd = -1;
  for (auto pause = std::chrono::milliseconds(5);; pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
    fd = open_retry(path, flags | O_NONBLOCK | O_NOCTTY, mode, ec);
    if (ec != std::errc::resource_unavailable_try_again || std::chrono::steady_clock::now() > give_up) break;
    std::this_thread::sleep_for(pause);
  }
  if (fd < 0) {
    if (ec == std::errc::no_such_device_or_address && ::stat(path, &st) != 0) st = {};
    return -1;
  }
  if (sys().fstat(fd, &st) != 0) {
    ec = std::error_code(errno, std::generic_category());
    sys().close(fd);
    return -1;
  }
  return fd;
}

bool set_blocking(int fd) noexcept {
  const int status = ::fcntl(fd, F_GETFL);
  return status >= 0 && ::fcntl(fd, F_SETFL, status & ~O_NONBLOCK) == 0;
}

std::size_t pread_full(int fd, void* buf, std::size_t nbytes, std::uint64_t offset, std::error_code& ec) noexcept {
  auto* p = static_cast<std::byte*>(buf);
  std::size_t done = 0;
  ec.clear();
  while (done < nbytes) {
    ssize_t r = sys().pread(fd, p + done, nbytes - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      ec = std::error_code(errno, std::generic_category());
      return done;
    }
    if (r == 0) break;  // end of file
    done += static_cast<std::size_t>(r);
  }
  return done;
}

std::uint64_t size_of(int fd, std::error_code& ec, const char** op) noexcept {
  struct stat st {};
  if (sys().fstat(fd, &st) != 0) {
    ec = std::error_code(errno, std::generic_category());
    if (op) *op = "fstat";
    return 0;
  }
  if (!S_ISBLK(st.st_mode)) return static_cast<std::uint64_t>(st.st_size);
  std::uint64_t nbytes = 0;
  if (sys().block_device_size(fd, &nbytes) != 0) {
    ec = std::error_code(errno, std::generic_category());
    if (op) *op = "ioctl BLKGETSIZE64";
    return 0;
  }
  return nbytes;
}

std::size_t pwrite_full(int fd, const void* buf, std::size_t nbytes, std::uint64_t offset, std::error_code& ec) noexcept {
  const auto* p = static_cast<const std::byte*>(buf);
  std::size_t done = 0;
  ec.clear();
  while (done < nbytes) {
    ssize_t r = sys().pwrite(fd, p + done, nbytes - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      ec = std::error_code(errno, std::generic_category());
      return done;
    }
    if (r == 0) {  // no progress: the device is full (never report it as written)
      ec = std::error_code(ENOSPC, std::generic_category());
      return done;
    }
    done += static_cast<std::size_t>(r);
  }
  return done;
}

std::error_code unique_fd::close() noexcept {
  if (fd_ < 0) return {};
  const int r = sys().close(std::exchange(fd_, -1));
  return r == 0 ? std::error_code() : std::error_code(errno, std::generic_category());
}

void unique_fd::reset(int fd) noexcept {
  if (fd_ >= 0) sys().close(fd_);
  fd_ = fd;
}

}  // namespace gdskit::posix
