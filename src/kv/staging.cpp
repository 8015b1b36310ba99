#include "kv/staging.hpp"

#include <sys/mman.h>

#include <cerrno>

#include "gdskit/error.hpp"

namespace gdskit::kv::detail {

staging_pool::staging_pool(std::size_t slab_bytes, std::size_t count, bool pinned)
    : slab_bytes_(slab_bytes), count_(count), pinned_(pinned) {
  const std::size_t total = slab_bytes * count;
  std::uint8_t* base = nullptr;
  if (pinned) {
    pinned_memory_ = pinned_buffer(total, 0);
    base = static_cast<std::uint8_t*>(pinned_memory_.data());
  } else {
    // Anonymous memory: page aligned, and pages are only taken when first touched.
    host_memory_ = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host_memory_ == MAP_FAILED) {
      host_memory_ = nullptr;
      throw error(errno_code(errno), "mmap", "", -1, total, "staging memory of the block store");
    }
    host_bytes_ = total;
    base = static_cast<std::uint8_t*>(host_memory_);
  }
  free_.reserve(count);
  for (std::size_t i = count; i-- > 0;) free_.push_back(base + i * slab_bytes);
}

staging_pool::~staging_pool() {
  if (host_memory_ != nullptr) ::munmap(host_memory_, host_bytes_);
}

std::vector<std::uint8_t*> staging_pool::take(std::size_t want, std::chrono::steady_clock::time_point deadline,
                                              bool wait, const std::atomic<bool>* stop) {
  std::vector<std::uint8_t*> out;
  std::unique_lock lock(mutex_);
  if (wait) {
    cv_.wait_until(lock, deadline, [&] { return !free_.empty() || (stop != nullptr && stop->load()); });
    if (stop != nullptr && stop->load()) return out;
  }
  while (out.size() < want && !free_.empty()) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  return out;
}

void staging_pool::give(const std::vector<std::uint8_t*>& slabs) {
  if (slabs.empty()) return;
  {
    std::lock_guard lock(mutex_);
    free_.insert(free_.end(), slabs.begin(), slabs.end());
  }
  cv_.notify_all();
}

void staging_pool::wake() {
  { std::lock_guard lock(mutex_); }
  cv_.notify_all();
}

}  // namespace gdskit::kv::detail
