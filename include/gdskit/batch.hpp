// Batches: many ranges, across many files, host or GPU memory, moved as one submission and completed together.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/path.hpp"

namespace gdskit {

/// Which way a batch moves bytes.
enum class io_direction { read, write };

/// One range of a batch: all `memory.nbytes` bytes between `memory` (host, pinned or GPU memory) and
/// [offset_bytes, offset_bytes + memory.nbytes) of `*file`.
/// `file` must point to an open handle until submit() returns; the batch then holds the file open itself
/// (closing the handle waits for the batch). The memory must stay valid until the batch is released (below).
struct io_range {
  const file_handle* file = nullptr;
  std::uint64_t offset_bytes = 0;
  buffer_view memory;
  /// With batch_options::checksum on a read: the CRC32C (checksum.hpp) the range's bytes must have.
  std::uint32_t crc32c = 0;
};

/// What happened to one range.
struct range_result {
  /// Bytes moved. A read moves fewer than asked only when the file ends first (and then, with
  /// batch_options::exact, `error` is ENODATA). A write that succeeded moved them all.
  std::size_t nbytes = 0;
  /// Empty on success; else errno (EIO, ENOSPC, ETIMEDOUT at the deadline, ECANCELED after cancel(), ...),
  /// cuFile or CUDA category.
  std::error_code error;
  /// Seconds from the start of the range's first file request to its completion (0 when it needed none):
  /// the latency of the range itself, without the time it waited in the batch's queue.
  double latency_s = 0;
  /// With batch_options::checksum: the CRC32C of the range's bytes as they were read (even when they did not
  /// match, EBADMSG) or as they were written.
  std::uint32_t crc32c = 0;
  bool ok() const noexcept { return !error; }
};

/// Checksums a batch computes while the bytes sit in host memory (the staging of GPU transfers included).
enum class batch_checksum { none, crc32c };

/// How a batch runs. Everything has a default that suits random reads of small ranges.
struct batch_options {
  /// When set, the batch completes by this time at the latest: ranges still unfinished then complete with
  /// ETIMEDOUT (see batch_future::released() for their memory).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  /// Reads of one file whose ranges lie at most this many bytes apart are served by one request when both fit
  /// in it (the bytes between are read and dropped). 0: only ranges that touch or overlap are joined.
  std::size_t coalesce_gap_bytes = std::size_t{16} << 10;
  /// Requests kept in flight. 0: the device's scheduler decides (enough small requests to keep the device
  /// busy, large ones at its measured depth).
  unsigned queue_depth = 0;
  /// A read that ends short (the file ends first) is an error (ENODATA) instead of a short count.
  bool exact = false;
  /// crc32c: every range's bytes are checksummed on the way. A read is delivered only when its bytes match the
  /// range's io_range::crc32c (else EBADMSG, and its memory is not written; a short read is ENODATA); a write
  /// reports the checksum of the bytes it wrote. Ranges are then moved whole (at most 16 MiB each, EINVAL
  /// otherwise) and reads always go through staging.
  batch_checksum checksum = batch_checksum::none;
  /// CUDA stream (a CUstream) to order the batch with; nullptr for none. A read: work queued on the stream
  /// after submit() waits, on the GPU, until every range has completed (the host is not blocked). A write:
  /// the I/O starts once the stream has reached the point of submit(), so a kernel queued before it has
  /// finished writing the source memory. Needs a usable GPU (ENODEV otherwise).
  void* stream = nullptr;
};

/// Routes a batch's ranges took: which path moved how many ranges.
struct batch_routes {
  std::size_t host = 0;     ///< host memory, through io_uring or the thread pool
  std::size_t staged = 0;   ///< GPU memory through pinned host slots
  std::size_t gds = 0;      ///< GPU memory through cuFile (true GDS or cuFile's compat mode)
  std::size_t requests = 0; ///< file requests issued (ranges joined count once, a range split at the request size once per piece)
  /// Of `requests`, those through the page cache instead of O_DIRECT: ranges found cached, pieces O_DIRECT
  /// cannot take, files where O_DIRECT is refused or off.
  std::size_t buffered = 0;
};

/// The outcome of a batch.
struct batch_result {
  /// One entry per range, in the order the ranges were given.
  std::vector<range_result> ranges;
  /// Bytes moved by all ranges, and how many ranges failed.
  std::size_t nbytes = 0;
  std::size_t failed = 0;
  batch_routes routes;
  /// Checksummed reads whose bytes did not match their io_range::crc32c (those ranges failed with EBADMSG).
  std::size_t checksum_mismatches = 0;
  /// Seconds from submit() to completion.
  double seconds = 0;
  bool ok() const noexcept { return failed == 0; }
};

namespace detail {
struct batch_state;
}

/// The completion of a submitted batch. Move-only. One model for every asynchronous operation of gdskit:
/// block with a timeout, poll an event file descriptor from an event loop, or cancel.
class batch_future {
 public:
  /// An empty future: valid() is false and every other call throws gdskit::error (EINVAL).
  batch_future() noexcept;
  explicit batch_future(std::shared_ptr<detail::batch_state> state) noexcept;
  /// Waits until the batch is released (below): memory the caller passed must not be reused while a request
  /// still targets it, so destroying the future never leaves one running.
  ~batch_future();
  batch_future(batch_future&&) noexcept;
  batch_future& operator=(batch_future&&) noexcept;
  batch_future(const batch_future&) = delete;
  batch_future& operator=(const batch_future&) = delete;

  bool valid() const noexcept { return state_ != nullptr; }
  /// Whether every range has completed (moved, failed, timed out or been cancelled).
  bool ready() const;
  /// Blocks until ready(); never longer than the batch's deadline.
  void wait() const;
  /// Blocks until ready() or the timeout; returns ready().
  bool wait_for(std::chrono::nanoseconds timeout) const;
  /// Blocks until at most `n` ranges have not completed (or the batch is ready: never longer than its
  /// deadline); returns how many have not. Lets a caller queue its next batch while this one's last ranges run.
  std::size_t wait_pending_at_most(std::size_t n) const;
  /// A file descriptor (eventfd) that becomes readable once the batch is ready and stays readable. Owned by the
  /// batch: do not read or close it; valid while the future lives.
  int fd() const;
  /// Asks the batch to stop: ranges not yet completed complete with ECANCELED as soon as their requests are
  /// withdrawn (a request that already reached the device ends first). Returns false, changing nothing, when
  /// the batch had already completed.
  bool cancel() const;
  /// Waits until ready(), then the outcome (valid while the future lives).
  const batch_result& get() const;
  /// Whether nothing of the batch still targets the caller's memory: every file request has ended and every
  /// copy has finished. The same as ready() except after a deadline or cancel(): ranges then complete at once,
  /// while a request the kernel already holds may still land in (or read from) their memory until it ends.
  bool released() const;
  /// Blocks until released().
  void wait_released() const;
  /// Calls `callback` once the batch is ready: at once, on this thread, when it already is; else on a thread
  /// of gdskit's pool, after the batch's waiters woke. Chains work without a thread that waits: submit the
  /// next batch, post to an event loop. It must not block for long (the pool runs every batch's callbacks and
  /// drivers): nor may it drop the last batch_future of a batch not released yet, as that waits for the
  /// release. It may call any of gdskit's functions; an exception it throws is logged and dropped. Callbacks added
  /// before the batch was ready run one after another, in the order they were added. The future may be
  /// destroyed before they run: they do not need it (get() is for the waiters; capture what you need).
  void on_ready(std::function<void()> callback) const;

 private:
  std::shared_ptr<detail::batch_state> state_;
};

/// The completion of one asynchronous range (file_handle's *_async forms): a batch of one range, with the
/// same waits, event descriptor and cancel, whose get() returns the bytes moved or throws the range's error as
/// gdskit::error naming the file and the range.
class io_future {
 public:
  io_future() noexcept = default;
  io_future(batch_future batch, std::string path, std::uint64_t offset_bytes, std::size_t nbytes, bool write);

  bool valid() const noexcept { return batch_.valid(); }
  bool ready() const { return batch_.ready(); }
  void wait() const { batch_.wait(); }
  bool wait_for(std::chrono::nanoseconds timeout) const { return batch_.wait_for(timeout); }
  int fd() const { return batch_.fd(); }
  bool cancel() const { return batch_.cancel(); }
  bool released() const { return batch_.released(); }
  void wait_released() const { batch_.wait_released(); }
  /// Waits; the bytes moved, or throws the range's error.
  std::size_t get() const;
  const batch_future& batch() const noexcept { return batch_; }

 private:
  batch_future batch_;
  std::string path_;
  std::uint64_t offset_ = 0;
  std::size_t nbytes_ = 0;
  bool write_ = false;
};

/// Submits ranges to be read from (io_direction::read) or written to (write) their files, and returns at once.
/// Checks every range before any I/O and throws gdskit::error naming the first bad one by index: EINVAL for a
/// null file or memory, a range past the largest file offset, reads whose destinations overlap in memory, or
/// writes that overlap in one file; EBADF for a closed handle or one not opened for that direction; ENODEV
/// for GPU memory without a usable GPU or on a GPU this process does not see. Any number of ranges: they are
/// queued internally and memory stays bounded by the number of ranges (a few hundred bytes each). Ranges of size 0 complete at once with 0 bytes.
/// Each range then succeeds or fails on its own: one failing never fails or delays the others.
batch_future submit(io_direction dir, std::span<const io_range> ranges, const batch_options& options = {});

/// submit() and wait for the result.
batch_result transfer(io_direction dir, std::span<const io_range> ranges, const batch_options& options = {});

inline batch_future submit_reads(std::span<const io_range> ranges, const batch_options& options = {}) {
  return submit(io_direction::read, ranges, options);
}
inline batch_future submit_writes(std::span<const io_range> ranges, const batch_options& options = {}) {
  return submit(io_direction::write, ranges, options);
}
inline batch_result read_batch(std::span<const io_range> ranges, const batch_options& options = {}) {
  return transfer(io_direction::read, ranges, options);
}
inline batch_result write_batch(std::span<const io_range> ranges, const batch_options& options = {}) {
  return transfer(io_direction::write, ranges, options);
}

}  // namespace gdskit
