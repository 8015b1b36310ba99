#include "gpu/cufile_path.hpp"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "engine/io_schedule.hpp"
#include "engine/piece_cursor.hpp"
#include "engine/thread_pool.hpp"
#include "gdskit/error.hpp"
#include "gpu/cuda_raii.hpp"
#include "engine/pipeline.hpp"
#include "shim/cufile.hpp"

namespace gdskit::gpu {

using namespace shim;

namespace {

// cuFile reads its mode once per process, when the driver opens. GDSKIT_MODE=compat configures compat before
// that open (shim::driver_opener); once the driver is open in one mode, a transfer asking for the other is
// refused rather than run under a label that is not true.
void open_driver_for(const engine::open_file& f, bool compat) {
  const int open_status = cufile_driver_open(compat);
  if (open_status != CU_FILE_SUCCESS) throw error(cufile_code(open_status), "cuFileDriverOpen", f.path.string(), -1, 0);
  if (compat && !cufile_driver_compat()) {
    throw error(errno_code(ENOTSUP), "cuFileDriverOpen", f.path.string(), -1, 0,
                "cuFile is already open in this process without compat mode; GDSKIT_MODE=compat must hold from the "
                "first cuFile transfer of the process");
  }
  if (!compat && cufile_driver_compat()) {
    throw error(errno_code(ENOTSUP), "cuFileDriverOpen", f.path.string(), -1, 0,
                "cuFile was opened in compat mode (GDSKIT_MODE=compat) by this process; a gds transfer would run "
                "compat");
  }
}

// cuFile handles are registered once per file_handle, on first use.
CUfileHandle_t registered_handle(const engine::open_file& f) {
  std::lock_guard lock(f.gpu.mutex);
  if (f.gpu.cufile_registered) return f.gpu.cufile.get();
  std::string reason;
  const cufile_api* api = cufile(&reason);
  if (api == nullptr) throw error(errno_code(ENOTSUP), "cuFile", f.path.string(), -1, 0, reason);
  open_driver_for(f, f.config.mode == path_mode::compat);
  CUfileError_t st{};
  cufile_handle h(f.direct_fd ? f.direct_fd.get() : f.fd.get(), st);
  if (st.err != CU_FILE_SUCCESS) {
    throw error(cufile_status_code(st), "cuFileHandleRegister", f.path.string(), -1, 0,
                st.err == CU_FILE_HANDLE_NOT_REGISTERED ? "no udev data for the file's device? see gdskit doctor" : "");
  }
  f.gpu.cufile = std::move(h);
  f.gpu.cufile_registered = true;
  return f.gpu.cufile.get();
}

}  // namespace

CUfileHandle_t cufile_handle_for(const engine::open_file& f) { return registered_handle(f); }

std::size_t cufile_transfer(const engine::open_file& f, bool write, buffer_view buf, std::size_t nbytes,
                            std::uint64_t offset) {
  if (nbytes == 0) return 0;
  if (!write) {
    const std::uint64_t size = f.current_size();
    if (offset >= size) return 0;
    nbytes = static_cast<std::size_t>(std::min<std::uint64_t>(nbytes, size - offset));
  }
  CUfileHandle_t h = cufile_handle_for(f);
  const cufile_api& api = *cufile();
  const int device = buf.device < 0 ? 0 : buf.device;
  // Depth and request size from the device's scheduler, like the host engine (cuFile's DMA into device memory
  // costs the host what an O_DIRECT read does), followed while the transfer runs: workers above the current
  // depth wait between requests, and each request is cut at the size asked for when it is taken.
  engine::scheduled_transfer sched(f.config, f.st_dev, write ? engine::io_dir::write : engine::io_dir::read,
                                   engine::io_client::host, nbytes);
  sched.start(nbytes);
  const unsigned deepest = sched.probing() ? sched.max_shape().depth : sched.shape().depth;
  const auto workers = static_cast<unsigned>(
      std::min<std::size_t>(deepest, engine::piece_count(offset, nbytes, std::size_t{1} << 20)));
  engine::piece_cursor cursor(offset, nbytes);
  const char* op = write ? "cuFileWrite" : "cuFileRead";
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::uint64_t first_error_at = UINT64_MAX;
  engine::parallel_for(workers, workers, [&](std::size_t worker) {
    const context_guard ctx(device);  // cuFile needs the context current; the worker gets its own back
    while (!failed.load(std::memory_order_relaxed)) {
      if (!cursor.may_take(static_cast<unsigned>(worker), sched.shape().depth)) continue;
      const auto p = cursor.take(sched.shape().request_bytes);
      if (!p) return;
      std::size_t got = 0;
      try {
        while (got < p->nbytes) {
          const off_t buf_off = static_cast<off_t>(p->offset - offset + got);
          const off_t file_off = static_cast<off_t>(p->offset + got);
          errno = 0;
          ssize_t r = write ? api.cuFileWrite(h, buf.data, p->nbytes - got, file_off, buf_off)
                            : api.cuFileRead(h, buf.data, p->nbytes - got, file_off, buf_off);
          if (r < 0) {
            std::error_code ec = decode_cufile_ssize(r, errno);
            if (ec == std::errc::interrupted) continue;
            throw error(ec, op, f.path.string(), file_off, p->nbytes - got);
          }
          if (r == 0) {
            if (write) throw error(errno_code(ENOSPC), op, f.path.string(), file_off, p->nbytes - got);
            break;  // end of file
          }
          got += static_cast<std::size_t>(r);
        }
      } catch (...) {
        // Keep the error of the lowest file offset: the one a sequential reader would have met first.
        std::lock_guard lock(error_mutex);
        if (!first_error || p->offset < first_error_at) {
          first_error = std::current_exception();
          first_error_at = p->offset;
        }
        failed = true;
        cursor.wake_all();
        return;
      }
      if (got < p->nbytes) cursor.ended_short(*p, got);
      sched.complete(got, p->request_bytes);
    }
  });
  if (first_error) std::rethrow_exception(first_error);
  return cursor.moved();
}

}  // namespace gdskit::gpu
