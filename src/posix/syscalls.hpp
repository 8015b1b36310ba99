// The one seam through which gdskit makes its file system calls. Tests replace entries to inject EINTR,
// short transfers, EIO and ENOSPC; production code never bypasses it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <system_error>
#include <utility>

namespace gdskit::posix {

struct syscall_table {
  std::function<int(const char*, int, mode_t)> open;
  std::function<int(int)> close;
  std::function<ssize_t(int, void*, std::size_t, off_t)> pread;
  std::function<ssize_t(int, const void*, std::size_t, off_t)> pwrite;
  std::function<int(int, struct stat*)> fstat;
  std::function<int(int, struct statfs*)> fstatfs;
  std::function<int(int, off_t)> ftruncate;
  /// fallocate(2): 0 or -1 with errno.
  std::function<int(int fd, int mode, off_t offset, off_t nbytes)> fallocate;
  std::function<int(int)> fdatasync;
  std::function<int(int, off_t, off_t, int)> fadvise;
  /// Size in bytes of the block device open as `fd` (ioctl BLKGETSIZE64; st_size is 0 for block devices).
  std::function<int(int fd, std::uint64_t* nbytes)> block_device_size;
  /// fsync (atomic publish syncs the folder that holds a renamed file).
  std::function<int(int)> fsync;
  /// renameat2(AT_FDCWD, from, AT_FDCWD, to, flags): flags 0 or RENAME_NOREPLACE.
  std::function<int(const char*, const char*, unsigned)> rename;
  /// link(2), the fallback for RENAME_NOREPLACE on file systems that lack it.
  std::function<int(const char*, const char*)> link;
  std::function<int(const char*)> unlink;
  /// io_uring completions pass through here: given what the kernel returned for an operation, returns what the
  /// engine sees. Identity in production; tests return -EINTR, -EIO, short counts.
  std::function<int(bool is_write, int fd, std::uint64_t offset, std::size_t nbytes, int result)> uring_result;
  /// io_uring_submit_and_wait on `ring` (an io_uring*): submits the prepared entries and waits for `wait_nr`
  /// completions; returns the entries submitted or -errno. Tests return errors without submitting.
  std::function<int(void* ring, unsigned wait_nr)> uring_submit_and_wait;
  /// io_uring_wait_cqe on `ring` without submitting: 0 once a completion is ready, or -errno.
  std::function<int(void* ring)> uring_wait;
  /// The same, for at most `timeout_ns` nanoseconds: -ETIME when none came in that time.
  std::function<int(void* ring, std::int64_t timeout_ns)> uring_wait_for;
};

/// The table in force. Tables are installed whole (scoped_syscalls) and never change once installed, so a
/// thread still finishing earlier work (a batch's last close on a pool thread) reads a complete table.
const syscall_table& sys() noexcept;
/// The table of the real system calls.
const syscall_table& real_syscalls() noexcept;

/// Installs `table` for its lifetime and restores the previous one (tests only). Installed tables are kept
/// for the life of the process: work that outlives the scope may still be calling through one (what its
/// functions capture must then outlive that work too). Scopes nest: the last one made is the first to end.
class scoped_syscalls {
 public:
  explicit scoped_syscalls(syscall_table table);
  ~scoped_syscalls();
  scoped_syscalls(const scoped_syscalls&) = delete;
  scoped_syscalls& operator=(const scoped_syscalls&) = delete;

 private:
  const syscall_table* saved_;
};

/// open(2) retried on EINTR. Returns the fd or -1 with `ec` set.
int open_retry(const char* path, int flags, mode_t mode, std::error_code& ec) noexcept;

/// open(2) that never waits on what it opens: with O_NONBLOCK (still set on the fd it returns: see
/// set_blocking) and O_NOCTTY, so that a FIFO without its other end or a terminal cannot hold it up or take
/// over. A lease someone else holds (a Samba oplock, an NFS delegation) fails such an open while its holder is
/// asked to give it up: tried again for up to 60 s, as a blocking open would wait. On success `st` is the
/// file's fstat; on ENXIO (a FIFO opened for writing without a reader, a socket) `st` is the path's stat where
/// it can be had (st_mode 0 otherwise), so that the caller can say what the path is. Returns the fd or -1 with
/// `ec` set.
int open_without_waiting(const char* path, int flags, mode_t mode, struct stat& st, std::error_code& ec) noexcept;

/// Clears O_NONBLOCK on `fd` (io_uring completes requests on a non-blocking file with EAGAIN instead of
/// waiting). False with errno set when fcntl fails.
bool set_blocking(int fd) noexcept;

/// Reads until `nbytes` are in or the file ends; EINTR retried, short reads looped. Returns the bytes read
/// (fewer only at end of file); on error returns the bytes read so far with `ec` set.
std::size_t pread_full(int fd, void* buf, std::size_t nbytes, std::uint64_t offset, std::error_code& ec) noexcept;

/// Writes all `nbytes`; EINTR retried, short writes looped, a write that makes no progress is ENOSPC.
/// On error returns the bytes written so far with `ec` set.
std::size_t pwrite_full(int fd, const void* buf, std::size_t nbytes, std::uint64_t offset, std::error_code& ec) noexcept;

/// Size in bytes of the file or block device open as `fd`: st_size for files, BLKGETSIZE64 for block devices
/// (whose st_size is 0). On error returns 0 with `ec` set; `op` then names the failing call ("fstat" or
/// "ioctl BLKGETSIZE64").
std::uint64_t size_of(int fd, std::error_code& ec, const char** op = nullptr) noexcept;

/// Move-only owner of a file descriptor; close is never retried (EINTR on close leaves the fd closed).
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the descriptor (ignoring errors) and takes `fd`.
  void reset(int fd = -1) noexcept;
  /// Closes the descriptor now and returns what close(2) reported (EINTR included: the descriptor is gone
  /// either way, and close is never retried). No-op returning no error when it holds none.
  std::error_code close() noexcept;

 private:
  int fd_ = -1;
};

}  // namespace gdskit::posix
