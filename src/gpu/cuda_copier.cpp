#include "gpu/cuda_copier.hpp"

#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "gdskit/error.hpp"

namespace gdskit::gpu {

using namespace shim;

staging_lane::staging_lane(int dev, unsigned nslots, std::size_t bytes)
    // Pinned, resident pages (huge pages where the kernel gives them): nothing to fault in later.
    : device(dev), slots(nslots), slot_bytes(bytes), pinned(static_cast<std::size_t>(nslots) * bytes, dev),
      stream(dev, CU_STREAM_NON_BLOCKING) {
  events.reserve(slots);
  // No blocking sync: the driver would arm a wake-up for every event it records (its event thread spent about
  // 20 us of CPU per 1 MiB piece), while a slot's copy has almost always finished when the slot comes round
  // again. wait() polls instead, and sleeps between polls when it has to wait at all.
  for (unsigned k = 0; k < slots; ++k) events.emplace_back(device, CU_EVENT_DISABLE_TIMING);
}

cuda_copier::cuda_copier(int device, unsigned slots_per_lane, std::size_t slot_bytes, unsigned count,
                         std::vector<std::unique_ptr<staging_lane>> ready)
    : device_(device), slots_(slots_per_lane), slot_bytes_(slot_bytes), lanes_(std::move(ready)) {
  if (count == 0 || lanes_.size() > count) throw error(errno_code(EINVAL), "cuda_copier: bad lane count");
  lanes_.resize(count);
  lane_contexts_.resize(count);
}

void cuda_copier::begin_lane(unsigned lane) { lane_contexts_[lane] = std::make_unique<context_guard>(device_); }

void cuda_copier::ready_lane(unsigned lane) {
  if (!lanes_[lane]) lanes_[lane] = std::make_unique<staging_lane>(device_, slots_, slot_bytes_);
}

std::vector<std::unique_ptr<staging_lane>> cuda_copier::release() {
  std::vector<std::unique_ptr<staging_lane>> out;
  for (auto& l : lanes_) {
    if (l) out.push_back(std::move(l));
  }
  lanes_.clear();
  return out;
}

void cuda_copier::end_lane(unsigned lane) noexcept { lane_contexts_[lane].reset(); }

std::byte* cuda_copier::slot(unsigned lane, unsigned s) {
  const staging_lane& l = *lanes_[lane];
  return static_cast<std::byte*>(l.pinned.data()) + static_cast<std::size_t>(s) * l.slot_bytes;
}

void cuda_copier::to_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  const cuda_api& a = cuda_or_throw();
  const staging_lane& l = *lanes_[lane];
  check_cuda(a.cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(far), slot(lane, s) + slot_offset, nbytes, l.stream.get()),
             "cuMemcpyHtoDAsync");
  check_cuda(a.cuEventRecord(l.events[s].get(), l.stream.get()), "cuEventRecord");
}

void cuda_copier::from_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  const cuda_api& a = cuda_or_throw();
  const staging_lane& l = *lanes_[lane];
  check_cuda(a.cuMemcpyDtoHAsync(slot(lane, s) + slot_offset, static_cast<CUdeviceptr>(far), nbytes, l.stream.get()),
             "cuMemcpyDtoHAsync");
  check_cuda(a.cuEventRecord(l.events[s].get(), l.stream.get()), "cuEventRecord");
}

void cuda_copier::wait(unsigned lane, unsigned s) {
  const cuda_api& a = cuda_or_throw();
  CUevent e = lanes_[lane]->events[s].get();
  // A copy about to finish is polled for a few tens of microseconds; after that the worker sleeps between polls,
  // 20 us at first and doubling up to 200 us, a small part of a copy that is still running (a 4 MiB slot takes
  // about 80 us at 50 GiB/s, longer when the link is shared).
  auto poll = [&] {
    const CUresult r = a.cuEventQuery(e);
    if (r == CUDA_SUCCESS) return true;
    if (r != CUDA_ERROR_NOT_READY) check_cuda(r, "cuEventQuery");
    return false;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(40);
  do {
    if (poll()) return;
  } while (std::chrono::steady_clock::now() < until);
  for (auto nap = std::chrono::microseconds(20);; nap = std::min(nap * 2, std::chrono::microseconds(200))) {
    std::this_thread::sleep_for(nap);
    if (poll()) return;
  }
}

namespace {
using pool_key = std::tuple<int, unsigned, std::size_t>;  // device, slots per lane, slot bytes
std::mutex pool_mutex;
// Never destroyed: at exit the driver may already be gone, and the OS returns pinned memory anyway.
std::map<pool_key, std::vector<std::unique_ptr<staging_lane>>>& pool() {
  static auto* p = new std::map<pool_key, std::vector<std::unique_ptr<staging_lane>>>();
  return *p;
}
}  // namespace

staging_lease::staging_lease(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes) {
  const pool_key key{device, slots_per_lane, slot_bytes};
  lanes = std::max(lanes, 1u);
  std::vector<std::unique_ptr<staging_lane>> got;
  got.reserve(lanes);
  {
    std::lock_guard lock(pool_mutex);
    auto& idle = pool()[key];
    while (got.size() < lanes && !idle.empty()) {
      got.push_back(std::move(idle.back()));
      idle.pop_back();
    }
  }
  // Lanes the pool lacks are created by the workers that use them (cuda_copier::ready_lane).
  copier_ = std::make_unique<cuda_copier>(device, slots_per_lane, slot_bytes, lanes, std::move(got));
}

staging_lease::~staging_lease() {
  if (!copier_) return;
  auto lanes = copier_->release();
  if (lanes.empty()) return;
  const auto& first = *lanes.front();
  const pool_key key{first.device, first.slots, first.slot_bytes};
  const std::size_t lane_bytes = static_cast<std::size_t>(first.slots) * first.slot_bytes;
  std::lock_guard lock(pool_mutex);
  auto& idle = pool()[key];
  for (auto& l : lanes) {
    if ((idle.size() + 1) * lane_bytes > k_idle_pinned_bytes && !idle.empty()) break;  // the rest are freed here
    idle.push_back(std::move(l));
  }
}

}  // namespace gdskit::gpu
