// Device buffers: the planner picks the path, the path moves the bytes.
#include "gpu/device_io.hpp"

#include <cerrno>

#include <fmt/format.h>

#include "engine/file_impl.hpp"
#include "engine/io_schedule.hpp"
#include "engine/planner.hpp"
#include "engine/residency.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gpu/cuda_copier.hpp"
#include "gpu/cufile_path.hpp"
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

std::size_t device_transfer(const file_handle& file, bool write, buffer_view buf, std::size_t nbytes, std::uint64_t offset) {
  const file_handle::impl& f = file_access::open_impl(file, write ? "pwrite" : "pread");
  const path_decision d = file.plan(buf);
  const char* op = write ? "pwrite" : "pread";
  std::string gpu_reason;
  if (!gpu_available(&gpu_reason)) {
    throw error(errno_code(ENODEV), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes,
                "device buffer but no usable GPU: " + gpu_reason);
  }
  switch (d.path) {
    case data_path::gds:
    case data_path::compat:
      return gpu::cufile_transfer(f, write, buf, nbytes, offset);
    default: {
      const int device = buf.device < 0 ? 0 : buf.device;
      // Lanes: every worker when the bytes come from the page cache (memory copies), the O_DIRECT depth when
      // they come from storage or go to it.
      const bool from_cache = !write && engine::prefer_page_cache(f, offset, nbytes);
      const bool scheduled = f.choice.direct && !from_cache;
      // Storage transfers take their depth (lanes) and request size (pieces) from the device's scheduler while
      // they run: a probing transfer leases lanes for the deepest shape it may be asked for and parks the ones
      // the current depth does not use; the others lease what the scheduler's best shape uses.
      engine::scheduled_transfer sched(f.config, f.st_dev, write ? engine::io_dir::write : engine::io_dir::read,
                                       engine::io_client::staged, scheduled ? nbytes : 0);
      gpu::staged_options options;
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
      const auto lanes = static_cast<unsigned>(std::min<std::size_t>(want, gpu::piece_count(offset, nbytes, piece)));
      gpu::staging_lease lease(device, lanes, f.config.staging_slots, slot);
      const auto far = reinterpret_cast<std::uintptr_t>(buf.data);
      return write ? gpu::staged_write(file, lease.get(), far, nbytes, offset, options)
                   : gpu::staged_read(file, lease.get(), far, nbytes, offset, options);
    }
  }
}

}  // namespace gpu

}  // namespace gdskit
