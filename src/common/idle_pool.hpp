// Idle buffers kept for reuse, by kind (a size, or a device and a size), within a cap on their bytes.
//
// Staging memory costs most when it is new: the kernel zeroes (and, for pinned memory, the driver pins) every
// page. Batches that end give their chunks back here and the next ones take them. Where the pool is full, a
// returned buffer displaces buffers of other kinds: the kinds batches give back are the kinds they ask for, and a
// pool kept full of one kind would otherwise turn every other one away for good.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace gdskit {

/// Thread-safe. `T` is a movable owner of a buffer (freed as it is destroyed), `Key` an ordered kind.
template <class Key, class T>
class idle_pool {
 public:
  explicit idle_pool(std::size_t cap_bytes) : cap_(cap_bytes) {}
  idle_pool(const idle_pool&) = delete;
  idle_pool& operator=(const idle_pool&) = delete;

  /// An idle buffer of `key`, if one is kept.
  std::optional<T> take(const Key& key) {
    std::lock_guard lock(mutex_);
    auto it = idle_.find(key);
    if (it == idle_.end() || it->second.items.empty()) return std::nullopt;
    std::optional<T> out(std::move(it->second.items.back()));
    it->second.items.pop_back();
    bytes_ -= it->second.nbytes;
    return out;
  }

  /// Keeps `item` (of `nbytes`) idle, making room by dropping buffers of other kinds; frees it where even that
  /// leaves no room, or where the lists cannot grow. Whatever is freed goes after the lock is released.
  void give(const Key& key, std::size_t nbytes, T item) noexcept {
    std::vector<T> dropped;  // declared before the lock: destroyed after it is released
    try {
      std::lock_guard lock(mutex_);
      if (nbytes > cap_) return;
      for (auto it = idle_.begin(); bytes_ + nbytes > cap_ && it != idle_.end(); ++it) {
        if (it->first == key) continue;
        while (!it->second.items.empty() && bytes_ + nbytes > cap_) {
          dropped.push_back(std::move(it->second.items.back()));
          it->second.items.pop_back();
          bytes_ -= it->second.nbytes;
        }
      }
      if (bytes_ + nbytes > cap_) return;  // full of its own kind
      kind& k = idle_[key];
      k.nbytes = nbytes;
      k.items.push_back(std::move(item));
      bytes_ += nbytes;
    } catch (...) {  // no room for the lists: `item` is freed as it goes
    }
  }

  /// Bytes kept idle now.
  std::size_t idle_bytes() const {
    std::lock_guard lock(mutex_);
    return bytes_;
  }

  /// Frees every idle buffer (after the lock is released).
  void clear() noexcept {
    std::map<Key, kind> gone;
    std::lock_guard lock(mutex_);
    gone.swap(idle_);
    bytes_ = 0;
  }

 private:
  struct kind {
    std::size_t nbytes = 0;  // of each buffer of the kind
    std::vector<T> items;
  };
  const std::size_t cap_;
  mutable std::mutex mutex_;
  std::map<Key, kind> idle_;
  std::size_t bytes_ = 0;
};

}  // namespace gdskit
