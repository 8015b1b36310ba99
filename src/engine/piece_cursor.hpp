// Pieces of one transfer handed out while it runs, so the request size can follow the scheduler mid-transfer.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace gdskit::engine {

/// Cuts [offset, offset + nbytes) into pieces in file order. Each piece ends at an absolute multiple of the
/// request size asked for when it is taken, so its aligned cover never exceeds that size and pieces of
/// different sizes tile the range without gaps. Thread-safe. The range must have been checked
/// (check_file_range): offset + nbytes does not wrap.
class piece_cursor {
 public:
  struct piece {
    std::uint64_t offset;       ///< file offset of the first byte
    std::size_t nbytes;
    std::size_t request_bytes;  ///< the size the piece was cut with
  };

  piece_cursor(std::uint64_t offset, std::size_t nbytes)
      : begin_(offset), end_(offset + nbytes), pos_(offset), exhausted_(nbytes == 0) {}

  /// The next piece, cut at multiples of `request_bytes` (> 0); empty when the range is used up.
  std::optional<piece> take(std::size_t request_bytes) {
    std::lock_guard lock(mutex_);
    if (pos_ >= end_) return std::nullopt;
    const std::uint64_t stop = std::min(end_, pos_ / request_bytes * request_bytes + request_bytes);
    piece p{pos_, static_cast<std::size_t>(stop - pos_), request_bytes};
    pos_ = stop;
    if (pos_ >= end_) exhausted_.store(true, std::memory_order_relaxed);
    return p;
  }

  /// Every piece has been handed out.
  bool exhausted() const { return exhausted_.load(std::memory_order_relaxed); }

  /// A read of `p` moved only `got` bytes: the file ends at p.offset + got.
  void ended_short(const piece& p, std::size_t got) {
    const std::uint64_t at = p.offset + got;
    std::uint64_t cur = short_end_.load();
    while (at < cur && !short_end_.compare_exchange_weak(cur, at)) {
    }
  }

  /// Bytes a reader got: up to the first place the file ended, else the whole range.
  std::size_t moved() const { return static_cast<std::size_t>(std::min(end_, short_end_.load()) - begin_); }

 private:
  const std::uint64_t begin_;
  const std::uint64_t end_;
  std::mutex mutex_;
  std::uint64_t pos_;
  std::atomic<bool> exhausted_;
  std::atomic<std::uint64_t> short_end_{UINT64_MAX};
};

}  // namespace gdskit::engine
