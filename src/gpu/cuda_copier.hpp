// The staged path's copier on a real GPU: pinned slots, one stream per lane, one event per slot.
#pragma once

#include <memory>
#include <vector>

#include "gpu/staged.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {

/// Pinned staging memory and streams for `lanes` workers on `device`. Expensive to create (pinning):
/// acquire one from staging_cache() instead of constructing per request.
class cuda_copier final : public copier {
 public:
  cuda_copier(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes);
  ~cuda_copier() override;
  cuda_copier(const cuda_copier&) = delete;
  cuda_copier& operator=(const cuda_copier&) = delete;

  unsigned lanes() const override { return lanes_; }
  unsigned slots_per_lane() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  int device() const { return device_; }
  void begin_lane(unsigned lane) override;
  std::byte* slot(unsigned lane, unsigned slot) override;
  void to_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void from_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void wait(unsigned lane, unsigned slot) override;

 private:
  int device_;
  unsigned lanes_;
  unsigned slots_;
  std::size_t slot_bytes_;
  std::byte* pinned_ = nullptr;
  std::vector<shim::CUstream> streams_;
  std::vector<shim::CUevent> events_;
};

/// A cache of copiers per (device, lanes, slots, slot size): a request takes one for its duration.
class staging_lease {
 public:
  staging_lease(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes);
  ~staging_lease();
  staging_lease(const staging_lease&) = delete;
  staging_lease& operator=(const staging_lease&) = delete;
  cuda_copier& get() { return *copier_; }

 private:
  std::unique_ptr<cuda_copier> copier_;
};

}  // namespace gdskit::gpu
