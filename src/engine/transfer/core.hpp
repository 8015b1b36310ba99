// The transfer core: every transfer of gdskit goes through it. A single range (file_handle::read/write) runs
// on the calling thread through its route; a gathered write runs as one pipeline; a batch of many ranges is
// planned into file requests (coalesced, split at the request size) and driven asynchronously.
//
// Routes: host memory goes through the host engine (io_uring or the thread pool, O_DIRECT where allowed); GPU
// memory through the path the planner picks for the file: cuFile (gds, compat) or staged (pinned host memory
// and the copy engine). The GPU layer provides its parts through gpu_backend (route.hpp), installed once by
// the API layer.
#pragma once

#include <memory>
#include <span>

#include "engine/open_file.hpp"
#include "engine/transfer/batch_state.hpp"
#include "engine/transfer/route.hpp"

namespace gdskit::engine {

class transfer_core {
 public:
  static transfer_core& instance();

  /// Installs the GPU layer's routes (once; later calls are ignored).
  void install(std::unique_ptr<gpu_backend> gpu);
  /// The installed GPU routes; throws gdskit::error (ENODEV) when none is.
  gpu_backend& gpu() const;

  /// One range, on the calling thread. Host memory: read short only at end of file, writes whole or throw.
  /// GPU memory: through the planner's path. The caller has checked the range and the memory.
  std::size_t move(const open_file& f, bool write, const buffer_view& mem, std::size_t nbytes,
                   std::uint64_t offset) const;
  /// A gathered write of extents (checked, sorted by offset, one memory kind and device, no overlaps).
  std::size_t gather(const open_file& f, std::span<const write_extent> sorted, const gather_options& options) const;
  /// Starts moving the batch's ranges and returns. Takes over the batch's submission hold (attach_files) and
  /// gives it back once it will start no further request for the batch.
  void run(const std::shared_ptr<detail::batch_state>& batch);

 private:
  std::unique_ptr<gpu_backend> gpu_;
  std::once_flag installed_;
};

}  // namespace gdskit::engine
