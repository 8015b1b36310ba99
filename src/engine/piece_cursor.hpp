// Pieces of one transfer handed out while it runs, so the request size can follow the scheduler mid-transfer.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace gdskit::engine {

/// One contiguous range of a transfer: `nbytes` at file offset `offset`, to or from memory address `far`.
struct transfer_extent {
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
  std::uintptr_t far = 0;
};

/// Cuts the extents of a transfer into pieces, extent after extent in the order given. Each piece lies in
/// one extent and ends at an absolute multiple of the request size asked for when it is taken, so its
/// aligned cover never exceeds that size and pieces of different sizes tile each extent without gaps.
/// Joined (`join_contiguous`), extents that follow one another in the file (each starts where the one before
/// ends) are cut as one range: a piece may then span several of them (for_each_segment lists its parts), so a
/// write of many small, unaligned, back-to-back extents still goes out in aligned requests.
/// Thread-safe. Every extent must have been checked (check_file_range): offset + nbytes does not wrap.
class piece_cursor {
 public:
  struct piece {
    std::uint64_t offset;       ///< file offset of the first byte
    std::size_t nbytes;
    std::size_t request_bytes;  ///< the size the piece was cut with
    std::uintptr_t far;         ///< memory address of the first byte
    std::size_t extent = 0;     ///< the extent that holds the first byte
  };

  /// One range [offset, offset + nbytes) to or from `far`.
  piece_cursor(std::uint64_t offset, std::size_t nbytes, std::uintptr_t far = 0)
      : piece_cursor(std::vector<transfer_extent>{{offset, nbytes, far}}) {}

  explicit piece_cursor(std::vector<transfer_extent> extents, bool join_contiguous = false)
      : extents_(std::move(extents)) {
    std::erase_if(extents_, [](const transfer_extent& e) { return e.nbytes == 0; });
    // run_end_[i]: where the range that extent i is cut in ends (its own end, or the joined run's).
    run_end_.resize(extents_.size());
    for (std::size_t i = extents_.size(); i-- > 0;) {
      const std::uint64_t end = extents_[i].offset + extents_[i].nbytes;
      run_end_[i] = join_contiguous && i + 1 < extents_.size() && extents_[i + 1].offset == end ? run_end_[i + 1] : end;
    }
    if (!extents_.empty()) pos_ = extents_.front().offset;
    exhausted_.store(extents_.empty(), std::memory_order_relaxed);
  }

  /// The next piece, cut at multiples of `request_bytes` (> 0); empty when every extent is used up.
  std::optional<piece> take(std::size_t request_bytes) {
    std::lock_guard lock(mutex_);
    if (index_ >= extents_.size()) return std::nullopt;
    const transfer_extent& e = extents_[index_];
    const std::uint64_t end = run_end_[index_];
    const std::uint64_t stop = std::min(end, pos_ / request_bytes * request_bytes + request_bytes);
    piece p{pos_, static_cast<std::size_t>(stop - pos_), request_bytes, e.far + static_cast<std::uintptr_t>(pos_ - e.offset),
            index_};
    pos_ = stop;
    // On past the extents this piece used up; a new run starts at its own offset.
    while (index_ < extents_.size() && pos_ >= extents_[index_].offset + extents_[index_].nbytes) {
      const bool last_of_run = run_end_[index_] == extents_[index_].offset + extents_[index_].nbytes;
      if (++index_ < extents_.size() && last_of_run) pos_ = extents_[index_].offset;
    }
    if (index_ >= extents_.size() && !exhausted_.exchange(true)) wake_all();
    return p;
  }

  /// Calls f(far, nbytes, at) for each extent's part of `p`, in file order (`at`: bytes from the piece's start).
  /// One call unless the cursor joins extents.
  template <class F>
  void for_each_segment(const piece& p, F&& f) const {
    std::uint64_t at = p.offset;
    const std::uint64_t end = p.offset + p.nbytes;
    for (std::size_t i = p.extent; at < end && i < extents_.size(); ++i) {
      const transfer_extent& e = extents_[i];
      const std::uint64_t stop = std::min(end, e.offset + e.nbytes);
      f(e.far + static_cast<std::uintptr_t>(at - e.offset), static_cast<std::size_t>(stop - at),
        static_cast<std::size_t>(at - p.offset));
      at = stop;
    }
  }

  /// Every piece has been handed out.
  bool exhausted() const { return exhausted_.load(std::memory_order_relaxed); }

  /// For a worker `worker` of a transfer whose current depth is `depth`: true when it may take a piece, or must
  /// see the end; else false after waiting, without polling, until the depth grows past it, every piece is
  /// handed out, wake_all() is called, or `park_timeout` passes (callers check for errors and cancellation
  /// between calls). Working workers report the depth they see, so a parked one wakes as soon as one of them
  /// sees it grow.
  bool may_take(unsigned worker, unsigned depth) {
    if (exhausted()) return true;
    const unsigned seen = depth_.exchange(depth);
    if (depth > seen) wake_all();
    if (worker == 0 || worker < depth) return true;
    std::unique_lock lock(park_mutex_);
    const std::uint64_t generation = wake_generation_;
    park_cv_.wait_for(lock, park_timeout_, [&] {
      return exhausted() || worker < depth_.load() || wake_generation_ != generation;
    });
    return false;
  }

  /// Wakes every parked worker (after a failure, so that they see it at once).
  void wake_all() {
    {
      std::lock_guard lock(park_mutex_);
      ++wake_generation_;
    }
    park_cv_.notify_all();
  }

  /// How long a parked worker waits before it looks again by itself.
  void set_park_timeout(std::chrono::milliseconds t) { park_timeout_ = t; }

  /// A read of `p` moved only `got` bytes: the file ends at p.offset + got.
  void ended_short(const piece& p, std::size_t got) {
    const std::uint64_t at = p.offset + got;
    std::uint64_t cur = short_end_.load();
    while (at < cur && !short_end_.compare_exchange_weak(cur, at)) {
    }
  }

  /// Bytes a reader of a single range got: up to the first place the file ended, else the whole range.
  std::size_t moved() const {
    if (extents_.empty()) return 0;
    const transfer_extent& e = extents_.front();
    return static_cast<std::size_t>(std::min(e.offset + e.nbytes, short_end_.load()) - e.offset);
  }

 private:
  std::vector<transfer_extent> extents_;
  std::vector<std::uint64_t> run_end_;
  std::mutex mutex_;
  std::size_t index_ = 0;
  std::uint64_t pos_ = 0;
  std::atomic<bool> exhausted_{false};
  std::atomic<std::uint64_t> short_end_{UINT64_MAX};
  // Parking: the depth working workers last saw, and a generation that wake_all() moves on.
  std::atomic<unsigned> depth_{0};
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  std::uint64_t wake_generation_ = 0;
  std::chrono::milliseconds park_timeout_{50};
};

}  // namespace gdskit::engine
