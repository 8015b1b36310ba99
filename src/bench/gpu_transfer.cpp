// GPU transfer types: device memory through the planner (gds, staged, compat) or the naive bounce.
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "bench/transfer.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/path.hpp"
#include "gpu/cuda_raii.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::bench {

namespace {

std::string_view path_name(data_path p) {
  switch (p) {
    case data_path::gds: return "gds";
    case data_path::staged: return "staged";
    case data_path::compat: return "compat";
    default: return "host";
  }
}

// The planner moves bytes between the file and device memory; the path mode was fixed when the file was opened.
class device_transfer final : public transfer {
 public:
  device_transfer(std::size_t capacity, int gpu, bool stream) : dev_(capacity, gpu) {
    if (stream) stream_ = gpu::cuda_stream(gpu, shim::CU_STREAM_NON_BLOCKING);
  }
  std::size_t read(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    return f.read(dev_.view(), n, offset);
  }
  std::size_t write(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    return f.write(dev_.view(), n, offset);
  }
  void load(const std::byte* src, std::size_t n, std::size_t at) override { dev_.copy_from_host(src, n, at); }
  void store(std::byte* dst, std::size_t n, std::size_t at) override { dev_.copy_to_host(dst, n, at); }
  buffer_view memory() const override { return dev_.view(); }
  void* stream() const override { return stream_.get(); }
  void sync_stream() override {
    if (!stream_) return;
    gpu::context_guard ctx(stream_.device());
    shim::check_cuda(shim::cuda_or_throw().cuStreamSynchronize(stream_.get()), "cuStreamSynchronize");
  }

 private:
  device_buffer dev_;
  gpu::cuda_stream stream_;
};

// The comparison point: plain pread into malloc'd (pageable) memory, then a synchronous copy to the GPU.
class naive_transfer final : public transfer {
 public:
  naive_transfer(std::size_t capacity, int gpu) : host_(capacity), dev_(capacity, gpu) {}
  std::size_t read(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    std::size_t got = f.pread(host_.data(), n, offset);
    dev_.copy_from_host(host_.data(), got);
    return got;
  }
  std::size_t write(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    dev_.copy_to_host(host_.data(), n);
    return f.pwrite(host_.data(), n, offset);
  }
  void load(const std::byte* src, std::size_t n, std::size_t at) override { dev_.copy_from_host(src, n, at); }
  void store(std::byte* dst, std::size_t n, std::size_t at) override { dev_.copy_to_host(dst, n, at); }
  buffer_view memory() const override { return dev_.view(); }

 private:
  std::vector<std::byte> host_;
  device_buffer dev_;
};

}  // namespace


std::unique_ptr<transfer> make_gpu_transfer(xfer_kind xfer, std::size_t capacity, int gpu, bool stream) {
  if (xfer == xfer_kind::naive) return std::make_unique<naive_transfer>(capacity, gpu);
  return std::make_unique<device_transfer>(capacity, gpu, stream);
}

path_report describe_gpu_path(xfer_kind xfer, const file_handle& f, int gpu) {
  if (xfer == xfer_kind::naive) {
    return {"naive", {"pread into malloc'd memory, then a synchronous copy to GPU " + std::to_string(gpu),
                      f.choice().direct_reason}};
  }
  // A one-page device buffer is enough to ask the planner; the decision is per file and device.
  device_buffer probe(4096, gpu);
  path_decision d = f.plan(probe.view());
  return {std::string(path_name(d.path)), d.reasons, d.direct_possible};
}

}  // namespace gdskit::bench
