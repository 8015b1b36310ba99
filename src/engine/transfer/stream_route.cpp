// The streaming routes: the staged pipeline on the GPU layer's pinned lanes, or cuFile, for one large range.
#include "engine/transfer/stream_route.hpp"

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "engine/host_copier.hpp"
#include "engine/io_schedule.hpp"
#include "engine/pipeline.hpp"
#include "engine/residency.hpp"
#include "gdskit/error.hpp"

namespace gdskit::engine {

namespace {

// Why a GPU buffer cannot be moved here, or empty.
void require_gpu(const open_file& f, const char* op, std::uint64_t offset, std::size_t nbytes) {
  std::string reason;
  if (!gpu_available(&reason)) {
    throw error(errno_code(ENODEV), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes,
                "device buffer but no usable GPU: " + reason);
  }
}

// One pipelined transfer of `nbytes` in total: lanes and piece sizes from the device's scheduler (of `client`)
// when the bytes come from or go to storage, every worker when they come from the page cache. Calls
// run(lanes, slot_bytes, options) with the lanes the copier should have and the slot size.
template <typename Run>
std::size_t pipelined(const open_file& f, bool write, bool from_cache, io_client client,
                      std::uint64_t first_offset, std::size_t nbytes, staged_options options, Run&& run) {
  const bool scheduled = f.choice.direct && !from_cache;
  // A probing transfer leases lanes for the deepest shape it may be asked for and parks the ones the current
  // depth does not use; the others lease what the scheduler's best shape uses.
  scheduled_transfer sched(f.config, f.st_dev, write ? io_dir::write : io_dir::read, client,
                                   scheduled ? nbytes : 0);
  unsigned want = from_cache ? f.config.threads : std::min(f.config.threads, f.config.direct_depth);
  const std::size_t slot = from_cache ? f.config.cached_slot_bytes : f.config.staging_slot_bytes;
  std::size_t piece = slot;
  if (scheduled) {
    sched.start(nbytes);
    const io_shape now = sched.shape();
    want = sched.probing() ? sched.max_shape().depth : now.depth;
    piece = std::min(now.request_bytes, slot);
    options.piece_bytes = piece;
    if (sched.probing()) {
      options.request_bytes = [&sched] { return sched.shape().request_bytes; };
      options.min_request_bytes = std::min<std::size_t>(std::size_t{1} << 20, slot);
      piece = options.min_request_bytes;
    }
    options.active_lanes = [&sched] { return sched.shape().depth; };
    options.on_direct_bytes = [&sched](std::size_t n, std::size_t request) { sched.complete(n, request); };
  }
  const auto lanes = static_cast<unsigned>(std::min<std::size_t>(want, piece_count(first_offset, nbytes, piece)));
  return run(std::max(1u, lanes), slot, std::as_const(options));
}

// The staged path: pinned lanes of `device` from the process-wide pool.
template <typename Run>
std::size_t staged(gpu_backend& gpu, const open_file& f, bool write, bool from_cache, int device,
                   std::uint64_t first_offset, std::size_t nbytes, staged_options options, Run&& run) {
  return pipelined(f, write, from_cache, io_client::staged, first_offset, nbytes, std::move(options),
                   [&](unsigned lanes, std::size_t slot, const staged_options& o) {
                     const auto lease = gpu.lease_lanes(device, lanes, f.config.staging_slots, slot);
                     return run(lease->get(), o);
                   });
}

std::vector<staged_extent> staged_extents(std::span<const write_extent> extents) {
  std::vector<staged_extent> cut;
  cut.reserve(extents.size());
  for (const auto& e : extents) cut.push_back({reinterpret_cast<std::uintptr_t>(e.src.data), e.offset_bytes, e.src.nbytes});
  return cut;
}

staged_options gather_staged_options(const gather_options& options) {
  staged_options o;
  o.cancelled = options.cancelled;
  o.on_bytes = options.progress;
  return o;
}

}  // namespace

std::size_t device_transfer(gpu_backend& gpu, const open_file& f, data_path path, bool write, buffer_view buf,
                            std::size_t nbytes, std::uint64_t offset) {
  require_gpu(f, write ? "pwrite" : "pread", offset, nbytes);
  switch (path) {
    case data_path::gds:
    case data_path::compat:
      return gpu.cufile_transfer(f, write, buf, nbytes, offset);
    default: {
      const int device = buf.device < 0 ? 0 : buf.device;
      const bool from_cache = !write && prefer_page_cache(f, offset, nbytes);
      const auto far = reinterpret_cast<std::uintptr_t>(buf.data);
      return staged(gpu, f, write, from_cache, device, offset, nbytes, {}, [&](copier& cp, const staged_options& o) {
        return write ? staged_write(f, cp, far, nbytes, offset, o) : staged_read(f, cp, far, nbytes, offset, o);
      });
    }
  }
}

std::size_t device_write_gather(gpu_backend& gpu, const open_file& f, data_path path,
                                std::span<const write_extent> extents, const gather_options& options) {
  std::size_t total = 0;
  for (const auto& e : extents) total += e.src.nbytes;
  if (total == 0) return 0;
  const buffer_view& first = extents.front().src;
  require_gpu(f, "pwrite", extents.front().offset_bytes, total);
  if (path == data_path::gds || path == data_path::compat) {
    // cuFile takes one buffer per call: extent after extent, each with its own schedule.
    std::size_t done = 0;
    for (const auto& e : extents) {
      if (options.cancelled && options.cancelled()) {
        throw error(errno_code(ECANCELED), "pwrite", f.path.string(), static_cast<std::int64_t>(e.offset_bytes),
                    e.src.nbytes, "cancelled");
      }
      done += gpu.cufile_transfer(f, true, e.src, e.src.nbytes, e.offset_bytes);
      if (options.progress) options.progress(e.src.nbytes);
    }
    return done;
  }
  const auto cut = staged_extents(extents);
  const int device = first.device < 0 ? 0 : first.device;
  return staged(gpu, f, true, false, device, cut.front().offset, total, gather_staged_options(options),
                [&](copier& cp, const staged_options& so) { return staged_write_extents(f, cp, cut, so); });
}

std::size_t host_write_gather(const open_file& f, std::span<const write_extent> extents, const gather_options& options) {
  std::size_t total = 0;
  for (const auto& e : extents) total += e.src.nbytes;
  if (total == 0) return 0;
  const auto cut = staged_extents(extents);
  // The staged pipeline's schedule and limits (slot-sized requests, at most 16 lanes): each piece is copied into
  // a slot and written from there, as a GPU write's pieces are.
  return pipelined(f, true, false, io_client::staged, cut.front().offset, total, gather_staged_options(options),
                   [&](unsigned lanes, std::size_t slot, const staged_options& o) {
                     host_copier cp(lanes, f.config.staging_slots, slot);
                     return staged_write_extents(f, cp, cut, o);
                   });
}

}  // namespace gdskit::engine
