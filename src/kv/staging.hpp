// The store's staging memory: equal slabs of one slot each (block data, padding, header page), 4 KiB aligned
// so that requests on O_DIRECT files need no bounce. Blocks are checked here before they reach the caller's
// memory, and a read past its deadline lands here instead of in the caller's memory. Pinned (page-locked) when
// a GPU is usable, so copies to and from GPU memory run at full rate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gdskit/buffer.hpp"

namespace gdskit::kv::detail {

class staging_pool {
 public:
  /// `count` slabs of `slab_bytes` (a multiple of 4 KiB). Throws gdskit::error when the memory cannot be had.
  staging_pool(std::size_t slab_bytes, std::size_t count, bool pinned);
  ~staging_pool();
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;

  /// Up to `want` slabs. With `wait`, blocks until at least one is free, the deadline passes or `*stop`
  /// becomes true (then it returns none); without, returns what is free now (maybe none).
  std::vector<std::uint8_t*> take(std::size_t want, std::chrono::steady_clock::time_point deadline, bool wait,
                                  const std::atomic<bool>* stop);
  void give(const std::vector<std::uint8_t*>& slabs);
  /// Wakes the waiters of take() (to look at their stop flag).
  void wake();

  buffer_view view(std::uint8_t* p, std::size_t n) const noexcept {
    return {p, n, pinned_ ? memory_kind::pinned : memory_kind::host, -1};
  }
  std::size_t slab_bytes() const noexcept { return slab_bytes_; }
  std::size_t count() const noexcept { return count_; }
  bool pinned() const noexcept { return pinned_; }

 private:
  std::size_t slab_bytes_, count_;
  bool pinned_;
  pinned_buffer pinned_memory_;
  void* host_memory_ = nullptr;
  std::size_t host_bytes_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::uint8_t*> free_;
};

}  // namespace gdskit::kv::detail
