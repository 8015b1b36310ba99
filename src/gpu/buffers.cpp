// device_buffer, pinned_buffer, cufile_registration and pointer classification over the driver shim.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "gdskit/buffer.hpp"
#include "gpu/buffers.hpp"
#include "gpu/cuda_raii.hpp"
#include "gdskit/error.hpp"
#include "posix/anon_memory.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/cufile.hpp"

namespace gdskit {

using namespace shim;

std::string_view to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::pinned: return "pinned";
    case memory_kind::device: return "device";
    case memory_kind::managed: return "managed";
    default: return "host";
  }
}

buffer_view buffer_view::sub(std::size_t offset_bytes, std::size_t n) const {
  if (offset_bytes > nbytes || n > nbytes - offset_bytes) {
    throw error(errno_code(EINVAL), fmt::format("buffer view {}+{} outside a buffer of {} bytes", offset_bytes, n, nbytes));
  }
  return {static_cast<std::byte*>(data) + offset_bytes, n, kind, device};
}

bool gpu_available(std::string* reason) { return cuda(reason) != nullptr; }

int gpu_count() {
  const cuda_api* a = cuda();
  if (a == nullptr) return 0;
  int n = 0;
  return a->cuDeviceGetCount(&n) == CUDA_SUCCESS ? n : 0;
}

namespace gpu {

buffer_view describe_pointer_with(const cuda_api* a, void* ptr, std::size_t nbytes) {
  if (ptr == nullptr) throw error(errno_code(EFAULT), "describe_pointer: null pointer");
  if (a == nullptr) return buffer_view::host(ptr, nbytes);
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  unsigned type = 0;
  CUresult r = a->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr);
  // Only "not a pointer the driver knows" means pageable host memory; anything else is a driver failure.
  if (r == CUDA_ERROR_INVALID_VALUE) return buffer_view::host(ptr, nbytes);
  check_cuda(r, "cuPointerGetAttribute (memory type)");
  int managed = 0;
  check_cuda(a->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, addr), "cuPointerGetAttribute (managed)");
  int ordinal = -1;
  check_cuda(a->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr),
             "cuPointerGetAttribute (device ordinal)");
  // The allocation must hold the whole range: a too-small foreign buffer is an error, never an overrun.
  CUdeviceptr start = 0;
  std::size_t range = 0;
  if (a->cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr) == CUDA_SUCCESS &&
      a->cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr) == CUDA_SUCCESS && range != 0) {
    if (addr - start + nbytes > range) {
      throw error(errno_code(EINVAL), fmt::format("buffer of {} bytes at offset {} of an allocation of {} bytes: too small",
                                                  nbytes, addr - start, range));
    }
  }
  if (managed != 0) return {ptr, nbytes, memory_kind::managed, ordinal};
  if (type == CU_MEMORYTYPE_HOST) return {ptr, nbytes, memory_kind::pinned, -1};
  if (type == CU_MEMORYTYPE_DEVICE) return {ptr, nbytes, memory_kind::device, ordinal};
  return {ptr, nbytes, memory_kind::managed, ordinal};
}

}  // namespace gpu

buffer_view describe_pointer(void* ptr, std::size_t nbytes) { return gpu::describe_pointer_with(cuda(), ptr, nbytes); }

device_buffer::device_buffer(std::size_t nbytes, int device) : nbytes_(nbytes), device_(device) {
  const cuda_api& a = cuda_or_throw();
  gpu::context_guard ctx(device);
  CUdeviceptr p = 0;
  check_cuda(a.cuMemAlloc(&p, nbytes == 0 ? 1 : nbytes), "cuMemAlloc");
  ptr_ = reinterpret_cast<void*>(p);
}

device_buffer::~device_buffer() {
  if (ptr_ == nullptr) return;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr_);
  gpu::release_in_context(device_, "cuMemFree", [p] { return cuda()->cuMemFree(p); });
}

device_buffer::device_buffer(device_buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), nbytes_(std::exchange(o.nbytes_, 0)), device_(std::exchange(o.device_, -1)) {}

device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    device_buffer tmp(std::move(*this));
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

void copy_into(const buffer_view& dst, std::size_t offset_bytes, const void* src, std::size_t nbytes) {
  const buffer_view d = dst.sub(offset_bytes, nbytes);
  if (nbytes == 0) return;
  if (d.kind == memory_kind::host || d.kind == memory_kind::pinned) {
    std::memcpy(d.data, src, nbytes);
    return;
  }
  gpu::context_guard ctx(d.device < 0 ? 0 : d.device);
  check_cuda(cuda_or_throw().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(d.data), src, nbytes), "cuMemcpyHtoD");
}

void copy_out(const buffer_view& src, std::size_t offset_bytes, void* dst, std::size_t nbytes) {
  const buffer_view s = src.sub(offset_bytes, nbytes);
  if (nbytes == 0) return;
  if (s.kind == memory_kind::host || s.kind == memory_kind::pinned) {
    std::memcpy(dst, s.data, nbytes);
    return;
  }
  gpu::context_guard ctx(s.device < 0 ? 0 : s.device);
  check_cuda(cuda_or_throw().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(s.data), nbytes), "cuMemcpyDtoH");
}

void device_buffer::copy_from_host(const void* src, std::size_t nbytes, std::size_t offset_bytes) {
  copy_into(view(), offset_bytes, src, nbytes);
}

void device_buffer::copy_to_host(void* dst, std::size_t nbytes, std::size_t offset_bytes) const {
  copy_out(view(), offset_bytes, dst, nbytes);
}

void device_buffer::fill(unsigned char value) {
  gpu::context_guard ctx(device_);
  check_cuda(cuda_or_throw().cuMemsetD8(reinterpret_cast<CUdeviceptr>(ptr_), value, nbytes_), "cuMemsetD8");
}

pinned_buffer::pinned_buffer(std::size_t nbytes, int device) : nbytes_(nbytes), device_(device) {
  const cuda_api& a = cuda_or_throw();
  gpu::context_guard ctx(device);
  posix::anon_memory m(nbytes);
  const CUresult r = a.cuMemHostRegister(m.data(), m.size(), MEMHOSTREGISTER_PORTABLE | MEMHOSTREGISTER_DEVICEMAP);
  if (r == CUDA_SUCCESS) {
    mapped_ = m.size();
    ptr_ = m.release();
    return;
  }
  // Some drivers and sandboxes refuse to register (pinned-memory limits): the driver's own allocator then
  // (huge_page_bytes() says 0 for it).
  void* p = nullptr;
  check_cuda(a.cuMemHostAlloc(&p, nbytes == 0 ? 1 : nbytes, MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
             "cuMemHostAlloc");
  ptr_ = p;
}

pinned_buffer::~pinned_buffer() {
  if (ptr_ == nullptr) return;
  void* p = ptr_;
  if (mapped_ == 0) {
    gpu::release_in_context(device_, "cuMemFreeHost", [p] { return cuda()->cuMemFreeHost(p); });
    return;
  }
  gpu::release_in_context(device_, "cuMemHostUnregister", [p] { return cuda()->cuMemHostUnregister(p); });
  ::munmap(p, mapped_);
}

std::size_t pinned_buffer::huge_page_bytes() const noexcept {
  return mapped_ == 0 ? 0 : std::min(posix::huge_page_bytes(ptr_), mapped_);
}

pinned_buffer::pinned_buffer(pinned_buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)),
      nbytes_(std::exchange(o.nbytes_, 0)),
      device_(std::exchange(o.device_, -1)),
      mapped_(std::exchange(o.mapped_, 0)) {}

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& o) noexcept {
  if (this != &o) {
    pinned_buffer tmp(std::move(*this));
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
    device_ = std::exchange(o.device_, -1);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

cufile_registration::cufile_registration(buffer_view device_memory) {
  std::string reason;
  const cufile_api* f = cufile(&reason);
  if (f == nullptr) throw error(errno_code(ENOTSUP), "cuFileBufRegister: " + reason);
  int open_status = cufile_driver_open();
  if (open_status != CU_FILE_SUCCESS) throw error(cufile_code(open_status), "cuFileDriverOpen");
  std::optional<gpu::context_guard> ctx;
  if (device_memory.device >= 0) ctx.emplace(device_memory.device);
  CUfileError_t st = f->cuFileBufRegister(device_memory.data, device_memory.nbytes, 0);
  if (st.err != CU_FILE_SUCCESS) throw error(cufile_status_code(st), "cuFileBufRegister");
  ptr_ = device_memory.data;
}

cufile_registration::~cufile_registration() {
  if (ptr_ != nullptr) {
    if (const cufile_api* f = cufile()) f->cuFileBufDeregister(ptr_);
  }
}

cufile_registration::cufile_registration(cufile_registration&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}

cufile_registration& cufile_registration::operator=(cufile_registration&& o) noexcept {
  if (this != &o) {
    cufile_registration tmp(std::move(*this));
    ptr_ = std::exchange(o.ptr_, nullptr);
  }
  return *this;
}

}  // namespace gdskit
