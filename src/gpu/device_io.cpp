// Device buffers: the planner picks the path, the path moves the bytes.
#include "gpu/device_io.hpp"

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "engine/file_impl.hpp"
#include "engine/io_schedule.hpp"
#include "engine/planner.hpp"
#include "engine/residency.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gpu/cuda_copier.hpp"
#include "gpu/cufile_path.hpp"
#include "gpu/host_copier.hpp"
#include "gpu/staged.hpp"
#include "shim/cufile.hpp"

namespace gdskit {

std::string_view to_string(data_path p) noexcept {
  switch (p) {
    case data_path::gds: return "gds";
    case data_path::staged: return "staged";
    case data_path::compat: return "compat";
    default: return "host";
  }
}

std::string path_decision::summary() const {
  std::string out(to_string(path));
  if (!reasons.empty()) {
    out += " (";
    for (std::size_t i = 0; i < reasons.size(); ++i) {
      if (i != 0) out += "; ";
      out += reasons[i];
    }
    out += ")";
  }
  return out;
}

namespace gpu {

namespace {

// Why a GPU buffer cannot be moved here, or empty.
void require_gpu(const file_handle::impl& f, const char* op, std::uint64_t offset, std::size_t nbytes) {
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
std::size_t pipelined(const file_handle::impl& f, bool write, bool from_cache, engine::io_client client,
                      std::uint64_t first_offset, std::size_t nbytes, gpu::staged_options options, Run&& run) {
  const bool scheduled = f.choice.direct && !from_cache;
  // A probing transfer leases lanes for the deepest shape it may be asked for and parks the ones the current
  // depth does not use; the others lease what the scheduler's best shape uses.
  engine::scheduled_transfer sched(f.config, f.st_dev, write ? engine::io_dir::write : engine::io_dir::read, client,
                                   scheduled ? nbytes : 0);
  unsigned want = from_cache ? f.config.threads : std::min(f.config.threads, f.config.direct_depth);
  const std::size_t slot = from_cache ? f.config.cached_slot_bytes : f.config.staging_slot_bytes;
  std::size_t piece = slot;
  if (scheduled) {
    sched.start(nbytes);
    const engine::io_shape now = sched.shape();
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
  const auto lanes = static_cast<unsigned>(std::min<std::size_t>(want, gpu::piece_count(first_offset, nbytes, piece)));
  return run(std::max(1u, lanes), slot, std::as_const(options));
}

// The staged path: pinned lanes of `device` from the process-wide pool.
template <typename Run>
std::size_t staged(const file_handle::impl& f, bool write, bool from_cache, int device, std::uint64_t first_offset,
                   std::size_t nbytes, gpu::staged_options options, Run&& run) {
  return pipelined(f, write, from_cache, engine::io_client::staged, first_offset, nbytes, std::move(options),
                   [&](unsigned lanes, std::size_t slot, const staged_options& o) {
                     gpu::staging_lease lease(device, lanes, f.config.staging_slots, slot);
                     return run(lease.get(), o);
                   });
}

std::vector<gpu::staged_extent> staged_extents(std::span<const write_extent> extents) {
  std::vector<gpu::staged_extent> cut;
  cut.reserve(extents.size());
  for (const auto& e : extents) cut.push_back({reinterpret_cast<std::uintptr_t>(e.src.data), e.offset_bytes, e.src.nbytes});
  return cut;
}

gpu::staged_options gather_staged_options(const gather_options& options) {
  gpu::staged_options o;
  o.cancelled = options.cancelled;
  o.on_bytes = options.progress;
  return o;
}

}  // namespace

std::size_t device_transfer(const file_handle& file, bool write, buffer_view buf, std::size_t nbytes, std::uint64_t offset) {
  const file_handle::impl& f = file_access::open_impl(file, write ? "pwrite" : "pread");
  const path_decision d = file.plan(buf);
  require_gpu(f, write ? "pwrite" : "pread", offset, nbytes);
  switch (d.path) {
    case data_path::gds:
    case data_path::compat:
      return gpu::cufile_transfer(f, write, buf, nbytes, offset);
    default: {
      const int device = buf.device < 0 ? 0 : buf.device;
      const bool from_cache = !write && engine::prefer_page_cache(f, offset, nbytes);
      const auto far = reinterpret_cast<std::uintptr_t>(buf.data);
      return staged(f, write, from_cache, device, offset, nbytes, {}, [&](copier& cp, const staged_options& o) {
        return write ? gpu::staged_write(file, cp, far, nbytes, offset, o) : gpu::staged_read(file, cp, far, nbytes, offset, o);
      });
    }
  }
}

std::size_t device_write_gather(const file_handle& file, std::span<const write_extent> extents,
                                const gather_options& options) {
  const file_handle::impl& f = file_access::open_impl(file, "pwrite");
  std::size_t total = 0;
  for (const auto& e : extents) total += e.src.nbytes;
  if (total == 0) return 0;
  const buffer_view& first = extents.front().src;
  require_gpu(f, "pwrite", extents.front().offset_bytes, total);
  const path_decision d = file.plan(first);
  if (d.path == data_path::gds || d.path == data_path::compat) {
    // cuFile takes one buffer per call: extent after extent, each with its own schedule.
    std::size_t done = 0;
    for (const auto& e : extents) {
      if (options.cancelled && options.cancelled()) {
        throw error(errno_code(ECANCELED), "pwrite", f.path.string(), static_cast<std::int64_t>(e.offset_bytes),
                    e.src.nbytes, "cancelled");
      }
      done += gpu::cufile_transfer(f, true, e.src, e.src.nbytes, e.offset_bytes);
      if (options.progress) options.progress(e.src.nbytes);
    }
    return done;
  }
  const auto cut = staged_extents(extents);
  const int device = first.device < 0 ? 0 : first.device;
  return staged(f, true, false, device, cut.front().offset, total, gather_staged_options(options),
                [&](copier& cp, const staged_options& so) { return gpu::staged_write_extents(file, cp, cut, so); });
}

std::size_t host_write_gather(const file_handle& file, std::span<const write_extent> extents,
                              const gather_options& options) {
  const file_handle::impl& f = file_access::open_impl(file, "pwrite");
  std::size_t total = 0;
  for (const auto& e : extents) total += e.src.nbytes;
  if (total == 0) return 0;
  const auto cut = staged_extents(extents);
  // The staged pipeline's schedule and limits (slot-sized requests, at most 16 lanes): each piece is copied into
  // a slot and written from there, as a GPU write's pieces are.
  return pipelined(f, true, false, engine::io_client::staged, cut.front().offset, total, gather_staged_options(options),
                   [&](unsigned lanes, std::size_t slot, const staged_options& o) {
                     host_copier cp(lanes, f.config.staging_slots, slot);
                     return gpu::staged_write_extents(file, cp, cut, o);
                   });
}

}  // namespace gpu

}  // namespace gdskit
