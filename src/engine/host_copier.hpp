// A copier whose far side is host memory: the staged pipeline's slots become aligned bounce buffers for
// O_DIRECT, so host-memory extents at any address and file offset go out in aligned requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/pipeline.hpp"
#include "posix/anon_memory.hpp"

namespace gdskit::engine {

/// `lanes` lanes of `slots_per_lane` slots of `slot_bytes` (a multiple of 4 KiB) in anonymous memory. A lane's
/// memory comes from a process-wide pool of idle lanes of that size, else is mapped by ready_lane; the destructor
/// gives it back (the pool keeps at most 1 GiB of idle lanes per size, the rest is unmapped). Copies run at once
/// on the calling thread, so wait() has nothing to wait for. ready_lane throws gdskit::error (ENOMEM) when the
/// memory cannot be mapped.
class host_copier final : public copier {
 public:
  host_copier(unsigned lanes, unsigned slots_per_lane, std::size_t slot_bytes);
  ~host_copier() override;
  host_copier(const host_copier&) = delete;
  host_copier& operator=(const host_copier&) = delete;

  unsigned lanes() const override { return static_cast<unsigned>(memory_.size()); }
  unsigned slots_per_lane() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  void begin_lane(unsigned) override {}
  void ready_lane(unsigned lane) override;
  void end_lane(unsigned) noexcept override {}
  std::byte* slot(unsigned lane, unsigned slot) override;
  void to_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void from_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) override;
  void wait(unsigned, unsigned) override {}

 private:
  unsigned slots_;
  std::size_t slot_bytes_;
  std::vector<posix::anon_memory> memory_;  // one mapping per lane, empty until ready_lane
};

}  // namespace gdskit::engine
