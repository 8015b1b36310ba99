// What the transfer core asks of the GPU layer. src/gpu implements it (gpu/routes.hpp) and the API layer
// installs it once (transfer_core::install): the core names no CUDA type and never includes src/gpu, and
// src/gpu depends only on the core's interfaces below it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <system_error>

#include "engine/open_file.hpp"
#include "engine/pipeline.hpp"
#include "gdskit/buffer.hpp"

namespace gdskit::engine {

/// Lanes of pinned slots for the staged pipeline, leased from a pool and given back when destroyed.
class copier_lease {
 public:
  virtual ~copier_lease() = default;
  virtual copier& get() = 0;
};

/// Copies between host staging memory and device memory for the batch driver, in groups: add() queues copies,
/// flush() issues every queued copy as one operation (one launch where the driver allows it) and calls
/// `done(token, ec)` from any thread once they have all finished (ec: the first failure). Copies of one group
/// may run in any order. Pinned staging comes from staging_chunk(); it stays valid until the copier is gone.
class group_copier {
 public:
  virtual ~group_copier() = default;
  /// Device memory the copier serves.
  virtual int device() const = 0;
  /// A chunk of `nbytes` (a multiple of 4 KiB) of page-locked host memory the device can copy from and to,
  /// aligned to 4 KiB; nullptr when no more can be pinned. Chunks live as long as the copier's owner keeps
  /// them (give_chunk) and are reused across batches. Drivers' io_uring rings keep chunks entered as
  /// registered buffers by address: a copier calls staging_unmapping() (common/staging_epoch.hpp) before it
  /// unmaps or frees a chunk, whichever way it goes.
  virtual std::byte* take_chunk(std::size_t nbytes) = 0;
  virtual void give_chunk(std::byte* chunk, std::size_t nbytes) noexcept = 0;
  /// Like give_chunk, for a chunk a request the kernel may still hold could write into: freed, never reused.
  virtual void discard_chunk(std::byte* chunk, std::size_t nbytes) noexcept { give_chunk(chunk, nbytes); }
  /// Queues one copy: host staging `host` <-> device address `device_ptr`, `nbytes` bytes; to_device says which way.
  virtual void add(bool to_device, std::byte* host, std::uintptr_t device_ptr, std::size_t nbytes) = 0;
  /// Issues the queued copies as one group (nothing when none is queued: `done` is not called).
  virtual void flush(std::uint64_t token, std::function<void(std::uint64_t token, std::error_code)> done) = 0;
  /// Calls, on the calling thread, `done` of the flushed groups the copier can already see have finished
  /// without waiting or a system call (a word the device writes after each group). Each group's `done` is
  /// called once, by whichever comes first of poll() and the copier's own call. Cheap enough to call on every
  /// wake of the driver.
  virtual void poll() noexcept {}
  /// Makes the copier end every group flushed so far by its own call once it lands, even if poll() is never
  /// called again. A copier that has poll() may leave its groups to it until then: the driver calls arm()
  /// before it sleeps with groups in flight and nothing else due to wake it soon. Cheap when nothing was
  /// flushed since the last call.
  virtual void arm() noexcept {}
  /// Blocks until every flushed group has finished and its `done` was called (before the staging it reads or
  /// writes is given back).
  virtual void drain() noexcept = 0;
  /// An error once the groups flushed so far can no longer finish (the device's context broke: their `done`
  /// will never be called); empty while they may still. Asked by the driver when groups take long to land.
  virtual std::error_code failure() noexcept { return {}; }
};

/// One entry of a cuFile batch: `nbytes` between `mem` and `offset` of `file`.
struct cufile_entry {
  const open_file* file = nullptr;
  bool write = false;
  buffer_view mem;
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
};

/// The GPU layer's routes.
class gpu_backend {
 public:
  virtual ~gpu_backend() = default;
  /// `lanes` lanes of `slots` pinned slots of `slot_bytes` on `device` for the staged pipeline. Throws
  /// gdskit::error when the device cannot be used.
  virtual std::unique_ptr<copier_lease> lease_lanes(int device, unsigned lanes, unsigned slots, std::size_t slot_bytes) = 0;
  /// One range through cuFile (the gds and compat paths). Reads return fewer bytes only at end of file.
  virtual std::size_t cufile_transfer(const open_file& f, bool write, buffer_view mem, std::size_t nbytes,
                                      std::uint64_t offset) = 0;
  /// Moves entries through cuFile's batch API (the route for many small ranges in true GDS): calls done(k,
  /// bytes, ec) once for each entry that ran; once stop() returns true the rest are skipped and those in flight
  /// cancelled and waited for. Returns false, having done nothing, when the library has no batch API.
  virtual bool cufile_batch(std::span<const cufile_entry> entries, const std::function<bool()>& stop,
                            const std::function<void(std::size_t k, std::size_t bytes, std::error_code ec)>& done) = 0;
  /// A copier for the batch driver on `device`. Throws gdskit::error when the device cannot be used.
  virtual std::unique_ptr<group_copier> make_group_copier(int device) = 0;
  /// Makes work queued on `stream` (a CUstream of `device`) after this call wait, on the GPU, until the returned
  /// function is called (once, from any thread; it makes no CUDA call). Throws gdskit::error when the stream
  /// cannot be made to wait.
  virtual std::function<void()> stream_gate(void* stream, int device) = 0;
  /// Calls `fn` (from a thread of the driver's; `fn` must make no CUDA call) once `stream` has reached this point.
  virtual void when_stream_reaches(void* stream, int device, std::function<void()> fn) = 0;
};

}  // namespace gdskit::engine
