#include "engine/host_copier.hpp"

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "gdskit/error.hpp"

namespace gdskit::engine {
namespace {

constexpr std::size_t k_idle_bytes = std::size_t{1} << 30;

std::mutex pool_mutex;
// Idle lanes by size. Never destroyed: lanes still idle at exit go with the process.
std::map<std::size_t, std::vector<posix::anon_memory>>& pool() {
  static auto* p = new std::map<std::size_t, std::vector<posix::anon_memory>>();
  return *p;
}

}  // namespace

host_copier::host_copier(unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes)
    : slots_(slots_per_lane), slot_bytes_(slot_bytes), memory_(lanes) {
  if (lanes == 0 || slots_per_lane == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0) {
    throw error(errno_code(EINVAL), "host_copier: bad lane shape");
  }
  const std::size_t lane_bytes = static_cast<std::size_t>(slots_) * slot_bytes_;
  std::lock_guard lock(pool_mutex);
  auto& idle = pool()[lane_bytes];
  for (auto& m : memory_) {
    if (idle.empty()) break;
    m = std::move(idle.back());
    idle.pop_back();
  }
}

host_copier::~host_copier() {
  const std::size_t lane_bytes = static_cast<std::size_t>(slots_) * slot_bytes_;
  std::lock_guard lock(pool_mutex);
  auto& idle = pool()[lane_bytes];
  for (auto& m : memory_) {
    if (m.data() == nullptr) continue;
    if ((idle.size() + 1) * lane_bytes > k_idle_bytes && !idle.empty()) break;  // the rest are unmapped here
    idle.push_back(std::move(m));
  }
}

void host_copier::ready_lane(unsigned lane) {
  if (memory_[lane].data() == nullptr) memory_[lane] = posix::anon_memory(static_cast<std::size_t>(slots_) * slot_bytes_);
}

std::byte* host_copier::slot(unsigned lane, unsigned s) {
  return static_cast<std::byte*>(memory_[lane].data()) + static_cast<std::size_t>(s) * slot_bytes_;
}

void host_copier::to_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  std::memcpy(reinterpret_cast<void*>(far), slot(lane, s) + slot_offset, nbytes);
}

void host_copier::from_far(unsigned lane, unsigned s, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) {
  std::memcpy(slot(lane, s) + slot_offset, reinterpret_cast<const void*>(far), nbytes);
}

}  // namespace gdskit::engine
