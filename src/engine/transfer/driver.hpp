// The batch driver: turns a batch's ranges into file requests and keeps them in flight from one thread.
//
// Ranges are sorted by file and offset and cut into requests on demand (memory stays bounded however many
// ranges there are): reads of one file that lie close together are joined into one request and delivered to
// each destination from staging memory; host memory that O_DIRECT can use as it is (aligned offset, size and
// address) is read into or written from directly; large ranges are split at absolute multiples of the request
// size. Requests go to io_uring (or to the thread pool where io_uring is unavailable), up to the depth and the
// bytes in flight the device's scheduler allows. GPU memory is reached through a group copier: the copies of
// every request completed in one round go out as one batched copy, and a range is reported only once its copy
// has landed. Very large ranges, and GPU memory the planner sends through cuFile, run through the core's
// single-range routes on the thread pool.
//
// Deadlines and cancel: the batch's stop descriptor wakes the driver, which withdraws what it has not issued,
// asks the kernel to cancel what it has, and waits for both before it lets go of the batch (released()).
// Bytes are copied into a range's memory only while the range is claimed, so none land after the range was
// reported; a request that reads straight into the caller's memory is covered by released() instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/transfer/batch_state.hpp"
#include "engine/transfer/route.hpp"

namespace gdskit::engine {

class transfer_core;

/// Tunables of the driver (defaults suit NVMe-class devices; tests use small values).
struct driver_limits {
  /// Largest file request: reads joined up to it, larger ranges split at its multiples.
  std::size_t max_request_bytes = std::size_t{4} << 20;
  /// Ranges at least this large run through the single-range routes instead.
  std::size_t stream_bytes = std::size_t{32} << 20;
  /// Requests in flight when the batch does not say (batch_options::queue_depth).
  unsigned default_depth = 64;
  /// Bytes of requests in flight at most, when the batch does not give a depth (at least the scheduler's
  /// depth x request size).
  std::size_t inflight_bytes = std::size_t{32} << 20;
};

/// The host staging memory of the process's batch drivers (bounce buffers for ranges O_DIRECT cannot use in
/// place, and every checksummed read): chunks mapped so far, and the bytes kept idle for the next batches.
/// And, over every driver (host or GPU staging): the requests that went through staging registered with
/// io_uring, the chunks entered in a ring's table of registered buffers, and the times a driver found its chunk
/// already entered by an earlier batch of its thread.
struct host_staging_counters {
  std::uint64_t chunks_mapped = 0;
  std::uint64_t bytes_mapped = 0;
  std::size_t idle_bytes = 0;
  std::uint64_t fixed_requests = 0;
  std::uint64_t fixed_file_requests = 0;  // requests on files registered with the driver's ring
  std::uint64_t chunks_entered = 0;
  std::uint64_t entries_reused = 0;
  /// The most the process's registrations may take (half the memory-lock limit when it was first looked at).
  std::uint64_t registration_limit = 0;
};
host_staging_counters host_staging();
/// Unmaps the idle host staging (the next batches map what they need anew). Pages a driver thread's io_uring
/// ring keeps registered stay pinned until that thread next enters a staging chunk.
void trim_host_staging() noexcept;

/// Plans and runs `batch` on the shared thread pool and returns at once; takes over the batch's submission
/// hold. GPU memory uses `core`'s GPU routes.
void run_batch(const transfer_core& core, const std::shared_ptr<detail::batch_state>& batch,
               const driver_limits& limits = {});

}  // namespace gdskit::engine
