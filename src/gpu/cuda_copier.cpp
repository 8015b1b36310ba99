#include "gpu/cuda_copier.hpp"

#include <cstring>
#include <mutex>

#include "gdskit/error.hpp"

namespace gdskit::gpu {

using namespace shim;

cuda_copier::cuda_copier(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes)
    : device_(device), lanes_(lanes), slots_(slots_per_lane), slot_bytes_(slot_bytes) {
  const cuda_api& a = cuda_or_throw();
  use_device(device);
  void* p = nullptr;
  check_cuda(a.cuMemHostAlloc(&p, static_cast<std::size_t>(lanes) * slots_per_lane * slot_bytes, MEMHOSTALLOC_PORTABLE),
             "cuMemHostAlloc (staging slots)");
  pinned_ = static_cast<std::byte*>(p);
  // Touch every page now: first-touch faults would otherwise land inside the first transfers.
  std::memset(pinned_, 0, static_cast<std::size_t>(lanes) * slots_per_lane * slot_bytes);
  try {
    for (unsigned l = 0; l < lanes; ++l) {
      CUstream s = nullptr;
      check_cuda(a.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      streams_.push_back(s);
      for (unsigned k = 0; k < slots_per_lane; ++k) {
        CUevent e = nullptr;
        // Blocking sync: a worker waiting for a slot sleeps instead of spinning a core.
        check_cuda(a.cuEventCreate(&e, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        events_.push_back(e);
      }
    }
  } catch (...) {
    this->~cuda_copier();
    throw;
  }
}

cuda_copier::~cuda_copier() {
  const cuda_api* a = cuda();
  if (a == nullptr) return;
  use_device(device_);
  for (auto e : events_) a->cuEventDestroy(e);
  for (auto s : streams_) a->cuStreamDestroy(s);
  events_.clear();
  streams_.clear();
  if (pinned_ != nullptr) a->cuMemFreeHost(pinned_);
  pinned_ = nullptr;
}

void cuda_copier::begin_lane(unsigned) { use_device(device_); }

std::byte* cuda_copier::slot(unsigned lane, unsigned slot) {
  return pinned_ + (static_cast<std::size_t>(lane) * slots_ + slot) * slot_bytes_;
}

void cuda_copier::to_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  const cuda_api& a = cuda_or_throw();
  check_cuda(a.cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(far), slot(lane, s) + slot_offset, nbytes, streams_[lane]),
             "cuMemcpyHtoDAsync");
  check_cuda(a.cuEventRecord(events_[lane * slots_ + s], streams_[lane]), "cuEventRecord");
}

void cuda_copier::from_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  const cuda_api& a = cuda_or_throw();
  check_cuda(a.cuMemcpyDtoHAsync(slot(lane, s) + slot_offset, static_cast<CUdeviceptr>(far), nbytes, streams_[lane]),
             "cuMemcpyDtoHAsync");
  check_cuda(a.cuEventRecord(events_[lane * slots_ + s], streams_[lane]), "cuEventRecord");
}

void cuda_copier::wait(unsigned lane, unsigned s) {
  check_cuda(cuda_or_throw().cuEventSynchronize(events_[lane * slots_ + s]), "cuEventSynchronize");
}

namespace {
struct cache_key {
  int device;
  unsigned lanes, slots;
  std::size_t slot_bytes;
  bool operator==(const cache_key&) const = default;
};
std::mutex cache_mutex;
// Never destroyed: at exit the driver may already be gone, and the OS returns pinned memory anyway.
std::vector<std::pair<cache_key, std::unique_ptr<cuda_copier>>>& cache() {
  static auto* c = new std::vector<std::pair<cache_key, std::unique_ptr<cuda_copier>>>();
  return *c;
}
}  // namespace

staging_lease::staging_lease(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes) {
  cache_key key{device, lanes, slots_per_lane, slot_bytes};
  {
    std::lock_guard lock(cache_mutex);
    auto& c = cache();
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (it->first == key) {
        copier_ = std::move(it->second);
        c.erase(it);
        return;
      }
    }
  }
  copier_ = std::make_unique<cuda_copier>(device, lanes, slots_per_lane, slot_bytes);
}

staging_lease::~staging_lease() {
  if (!copier_) return;
  cache_key key{copier_->device(), copier_->lanes(), copier_->slots_per_lane(), copier_->slot_bytes()};
  std::lock_guard lock(cache_mutex);
  // Keep a few idle sets; pinned memory is precious.
  if (cache().size() < 4) cache().emplace_back(key, std::move(copier_));
}

}  // namespace gdskit::gpu
