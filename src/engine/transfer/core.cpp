#include "engine/transfer/core.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "engine/thread_pool.hpp"
#include "engine/transfer/driver.hpp"
#include "engine/transfer/stream_route.hpp"
#include "gdskit/error.hpp"

namespace gdskit::engine {

transfer_core& transfer_core::instance() {
  static transfer_core* core = new transfer_core();  // never destroyed: batches may outlive static destructors
  return *core;
}

void transfer_core::install(std::unique_ptr<gpu_backend> gpu) {
  std::call_once(installed_, [&] { gpu_ = std::move(gpu); });
}

gpu_backend& transfer_core::gpu() const {
  if (!gpu_) throw error(errno_code(ENODEV), "transfer: this build has no GPU routes installed");
  return *gpu_;
}

std::size_t transfer_core::move(const open_file& f, bool write, const buffer_view& mem, std::size_t nbytes,
                                std::uint64_t offset) const {
  if (host_memory(mem)) return write ? f.write(mem.data, nbytes, offset) : f.read(mem.data, nbytes, offset);
  return device_transfer(gpu(), f, f.route(mem), write, mem, nbytes, offset);
}

std::size_t transfer_core::gather(const open_file& f, std::span<const write_extent> sorted,
                                  const gather_options& options) const {
  if (sorted.empty()) return 0;
  if (!host_memory(sorted.front().src)) {
    return device_write_gather(gpu(), f, f.route(sorted.front().src), sorted, options);
  }
  // Host memory, several extents, O_DIRECT: one pipeline through aligned slots, so that the joins between
  // extents fall inside aligned requests (a buffered write of a partial block waits on ext4 for every O_DIRECT
  // write in flight) and the device stays at its depth across small extents. A gather no larger than an inline
  // request is not worth the slots' memory.
  std::size_t total = 0;
  for (const auto& e : sorted) total += e.src.nbytes;
  if (sorted.size() > 1 && f.choice.direct && total > f.config.inline_bytes) {
    return host_write_gather(f, sorted, options);
  }
  // Otherwise extent after extent, each through the engine at full depth.
  std::size_t done = 0;
  for (const auto& e : sorted) {
    if (options.cancelled && options.cancelled()) {
      throw error(errno_code(ECANCELED), "pwrite", f.path.string(), static_cast<std::int64_t>(e.offset_bytes),
                  e.src.nbytes, "cancelled");
    }
    done += f.write(e.src.data, e.src.nbytes, e.offset_bytes);
    if (options.progress) options.progress(e.src.nbytes);
  }
  return done;
}

void transfer_core::run(const std::shared_ptr<detail::batch_state>& batch) { run_batch(*this, batch); }

}  // namespace gdskit::engine
