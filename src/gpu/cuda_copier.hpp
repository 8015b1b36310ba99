// The staged pipeline's copier on a real GPU: pinned slots, one stream per lane, one event per slot.
#pragma once

#include <memory>
#include <vector>

#include "gdskit/buffer.hpp"
#include "gpu/cuda_raii.hpp"
#include "engine/pipeline.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {

/// One worker's staging on `device`: `slots` pinned slots of `slot_bytes`, one stream, one event per slot.
/// Expensive to create (pinning): staging_lease takes lanes from a process-wide pool instead. Its members
/// own their resources, so a lane that fails half-way through construction frees what it had.
struct staging_lane {
  staging_lane(int device, unsigned slots, std::size_t slot_bytes);

  int device;
  unsigned slots;
  std::size_t slot_bytes;
  pinned_buffer pinned;
  cuda_stream stream;
  std::vector<cuda_event> events;
};

/// A copier over `count` lanes of one shape. Lanes given ready-made are used as they are; the others are
/// created by ready_lane, on the worker thread that is about to use them, so a transfer's lanes are pinned in
/// parallel while its first lanes already move data, and lanes its depth never comes near are not pinned.
class cuda_copier final : public engine::copier {
 public:
  cuda_copier(int device, unsigned slots_per_lane, std::size_t slot_bytes, unsigned count,
              std::vector<std::unique_ptr<staging_lane>> ready);
  cuda_copier(const cuda_copier&) = delete;
  cuda_copier& operator=(const cuda_copier&) = delete;

  unsigned lanes() const override { return static_cast<unsigned>(lanes_.size()); }
  unsigned slots_per_lane() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  /// Makes the device's context current on this thread; throws gdskit::error with the context restored.
  void begin_lane(unsigned lane) override;
  /// Creates the lane if it does not exist yet (between begin_lane and end_lane); throws gdskit::error
  /// (pinning, stream or event creation).
  void ready_lane(unsigned lane) override;
  void end_lane(unsigned lane) noexcept override;
  std::byte* slot(unsigned lane, unsigned slot) override;
  void to_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void from_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void wait(unsigned lane, unsigned slot) override;

  /// The lanes that exist (those given and those ready_lane created); the copier holds none afterwards.
  std::vector<std::unique_ptr<staging_lane>> release();

 private:
  int device_;
  unsigned slots_;
  std::size_t slot_bytes_;
  std::vector<std::unique_ptr<staging_lane>> lanes_;  // null until created
  std::vector<std::unique_ptr<context_guard>> lane_contexts_;  // held between begin_lane and end_lane
};

/// Lanes for one request, taken from a process-wide pool per (device, slots, slot size) and given back when the
/// lease ends, so concurrent requests (bench workers, loader threads) each hold only the lanes they use and
/// pinned memory is allocated once per lane, not once per request. The pool keeps at most
/// k_idle_pinned_bytes of idle lanes per shape; lanes beyond that are freed on return.
class staging_lease {
 public:
  static constexpr std::size_t k_idle_pinned_bytes = std::size_t{1} << 30;

  staging_lease(int device, unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes);
  ~staging_lease();
  staging_lease(const staging_lease&) = delete;
  staging_lease& operator=(const staging_lease&) = delete;
  cuda_copier& get() { return *copier_; }

 private:
  std::unique_ptr<cuda_copier> copier_;
};

}  // namespace gdskit::gpu
