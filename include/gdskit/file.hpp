// Files: open once, then read and write host memory in parallel, with O_DIRECT where the file system allows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "gdskit/buffer.hpp"
#include "gdskit/path.hpp"
#include "gdskit/settings.hpp"

namespace gdskit {

class io_future;  // batch.hpp

enum class open_mode { read, write, read_write };

/// How a file is opened. Nothing is created or truncated unless asked for.
struct open_options {
  bool create = false;     ///< O_CREAT
  bool truncate = false;   ///< O_TRUNC (needs write or read_write)
  bool exclusive = false;  ///< O_EXCL (with create: fail if the file exists)
  unsigned permissions = 0644;
};

/// What the engine decided for a handle, and why.
struct io_choice {
  bool direct = false;          ///< O_DIRECT in use
  std::string direct_reason;    ///< e.g. "O_DIRECT accepted", "tmpfs refuses O_DIRECT", "GDSKIT_DIRECT=off"
  engine_kind engine = engine_kind::threads;  ///< io_uring or threads (never automatic)
  std::string engine_reason;    ///< e.g. "io_uring available", "io_uring_setup: Operation not permitted"
  std::size_t alignment = 4096; ///< O_DIRECT offset and memory alignment used
};

/// An open file. Thread-safe: any number of reads and writes may run at once on one handle.
/// Move-only. The file stays open while the handle or any of its asynchronous operations needs it: destroying
/// the handle with operations in flight is safe, and the descriptors close when the last one ends.
/// A default-constructed or moved-from handle is empty: is_open() is false, the accessors return empty or
/// default values, and every I/O method throws gdskit::error (EBADF).
/// One range of a gathered write: all of `src` (src.nbytes bytes) to `offset_bytes` of the file.
struct write_extent {
  buffer_view src;
  std::uint64_t offset_bytes = 0;
};

/// Progress and cancellation of a gathered write.
struct gather_options {
  /// Called, from any of the transfer's threads, with the bytes of each request as it completes.
  std::function<void(std::size_t)> progress;
  /// Checked between requests, from any of the transfer's threads; once it returns true the write stops and
  /// throws ECANCELED.
  std::function<bool()> cancelled;
};

class file_handle {
 public:
  /// An empty handle (see above).
  file_handle() noexcept;
  /// Opens `path`: a regular file or a block device. Throws gdskit::error (errno category) naming the path when
  /// it cannot be opened, EISDIR for a folder, EINVAL at once (never waiting for the other end) for a FIFO, a
  /// socket or a character device, and EINVAL when settings.direct is `on` but the file system refuses O_DIRECT.
  file_handle(const std::filesystem::path& path, open_mode mode, open_options options = {},
              const settings& config = default_settings());
  ~file_handle();
  file_handle(file_handle&&) noexcept;
  file_handle& operator=(file_handle&&) noexcept;

  /// Reads up to `nbytes` at `offset_bytes` into host memory `buf` (any alignment). Returns the bytes read:
  /// fewer than asked only when the file ends first. Throws gdskit::error on any I/O error, naming the
  /// failing range; nothing is reported as read unless every byte before it was read.
  std::size_t pread(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// Like pread but the whole range must exist: throws short_read_error with the counts otherwise.
  void read_exact(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// Writes all `nbytes` from `buf` at `offset_bytes`; returns nbytes or throws (ENOSPC included: a
  /// full device is never a short success).
  std::size_t pwrite(const void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const;

  /// Asynchronous forms: one range submitted as a batch (batch.hpp); `buf` must stay valid until the future is
  /// released. The arguments are checked before it returns (it throws what the blocking form would for them,
  /// EBADF for an empty handle); the future's get() returns the bytes or throws the transfer's error, and the
  /// batch keeps the file open until it is released.
  io_future pread_async(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const;
  io_future pwrite_async(const void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const;

  /// Reads into host or GPU memory through the path the planner picks for this buffer (see plan()).
  /// `dst.nbytes` must be at least `nbytes`. Same contract as pread: fewer bytes only at end of file.
  std::size_t read(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// read() that throws short_read_error when the file ends first.
  void read_exact(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// Writes from host or GPU memory; returns nbytes or throws.
  std::size_t write(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// Writes many ranges (a checkpoint's tensors) as one transfer: one schedule for the device and, for GPU
  /// memory on the staged path or host memory with O_DIRECT, one pipeline through aligned slots, so the write
  /// stays at full depth however small each range is and ranges that follow one another in the file go out as
  /// one (their joins inside aligned requests).
  /// Every extent's memory must be of one kind (host and pinned count as one) and one device; ranges must not
  /// overlap in the file. Returns the bytes written or throws (EINVAL for bad extents before any I/O;
  /// ENOSPC included: a full device is never a short success).
  std::size_t write_gather(std::span<const write_extent> extents, const gather_options& options = {}) const;
  /// Asynchronous read() and write() for host or GPU buffers, as batches of one range: same contracts. The
  /// memory `dst`/`src` views must stay valid until the future is released; the handle need not (the batch
  /// keeps the file open, and close() waits for it). Bad arguments throw here; get() returns the bytes moved
  /// (a read: fewer only at end of file; a write: always nbytes) or throws the transfer's error.
  io_future read_async(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const;
  io_future write_async(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const;
  /// The path read()/write() take for this buffer, and the reasons (cheap; cached per device). An empty
  /// handle returns a default path_decision.
  path_decision plan(buffer_view buf) const;

  /// Current size of the file (fstat; for a block device, the device's size from BLKGETSIZE64).
  std::uint64_t size() const;
  /// Sets the size of the file (ftruncate).
  void truncate(std::uint64_t nbytes) const;
  /// Reserves disk space for the first `nbytes` of the file and makes it at least that long (fallocate), so
  /// a disk too full for them fails here (ENOSPC) rather than part-way through writing, and file systems such
  /// as ext4 run O_DIRECT writes into the reserved blocks in parallel (into a hole they take turns). Returns
  /// false when the file system cannot reserve space (EOPNOTSUPP, or EINVAL for a regular file): the size is
  /// then set as truncate() does. EINTR is retried; other errors (ENOSPC, EIO) are thrown.
  bool reserve(std::uint64_t nbytes) const;
  /// fdatasync.
  void sync() const;
  /// Drops this file's pages from the page cache (posix_fadvise DONTNEED). Dirty pages are written first
  /// (fdatasync); when that fails it throws the fdatasync error and drops nothing.
  void drop_cache() const;
  /// Closes the file now and reports it: throws gdskit::error ("close", errno category) when close(2) fails
  /// (file systems such as NFS report deferred write errors only here). Waits first for the handle's
  /// asynchronous operations still in flight. The handle is empty afterwards, even when it throws; closing an
  /// empty handle does nothing. Must not run concurrently with other calls on the same handle. The
  /// destructor closes too, but can only log a close error (to stderr).
  void close();

  /// Whether the handle holds an open file. The accessors below return the values of the open file, or empty
  /// and default values for an empty handle (path "", open_mode::read, io_choice{}, settings{}, fds -1).
  bool is_open() const noexcept;
  const std::filesystem::path& path() const noexcept;
  open_mode mode() const noexcept;
  const io_choice& choice() const noexcept;
  const settings& config() const noexcept;
  /// The buffered descriptor (always valid while open) and the O_DIRECT one (-1 when not in use).
  int fd() const noexcept;
  int direct_fd() const noexcept;

  struct impl;  ///< opaque

 private:
  friend struct file_access;  // gdskit's own data paths
  std::shared_ptr<impl> impl_;
};

/// Why io_uring can or cannot be used in this process (probed once): empty when it can.
const std::string& io_uring_unavailable_reason();

}  // namespace gdskit

// The completion types of the asynchronous forms.
#include "gdskit/batch.hpp"  // IWYU pragma: export
