// Memory that gdskit reads into and writes from: host, pinned host, or GPU device memory.
#pragma once

#include <cstddef>
#include <string>

namespace gdskit {

/// Where a buffer lives.
enum class memory_kind { host, pinned, device, managed };

std::string_view to_string(memory_kind k) noexcept;

/// A non-owning view of memory plus where it lives. `device` is the CUDA device ordinal for device memory
/// (-1 for host memory).
struct buffer_view {
  void* data = nullptr;
  std::size_t nbytes = 0;
  memory_kind kind = memory_kind::host;
  int device = -1;

  static buffer_view host(void* p, std::size_t n) noexcept { return {p, n, memory_kind::host, -1}; }
  /// A view of `n` bytes past `offset_bytes` of this view; throws gdskit::error (EINVAL) if out of range.
  buffer_view sub(std::size_t offset_bytes, std::size_t n) const;
};

/// Describes a pointer that gdskit did not allocate (torch, cupy, ...): asks the CUDA driver where it lives.
/// `host` means the driver does not know the pointer (pageable memory: CUDA_ERROR_INVALID_VALUE), or there is
/// no usable driver. Any other driver error throws gdskit::error (cuda category); a range that runs past the
/// pointer's allocation throws EINVAL, a null pointer EFAULT.
buffer_view describe_pointer(void* ptr, std::size_t nbytes);

/// Whether a CUDA GPU can be used by this process; when not, `reason` says why ("libcuda.so.1 not found",
/// "cuInit: CUDA_ERROR_NO_DEVICE", ...).
bool gpu_available(std::string* reason = nullptr);
/// Number of CUDA devices (0 when none can be used).
int gpu_count();

/// Synchronous copies between host memory and any view: memcpy for host and pinned views, the CUDA driver for
/// device and managed ones. For tools, tests and small pieces, not the fast path. Throw EINVAL when the range
/// lies outside the view, and CUDA errors from the driver.
void copy_into(const buffer_view& dst, std::size_t offset_bytes, const void* src, std::size_t nbytes);
void copy_out(const buffer_view& src, std::size_t offset_bytes, void* dst, std::size_t nbytes);

/// Owning GPU memory (cuMemAlloc on `device`). Move-only; a moved-from buffer is empty. Throws gdskit::error
/// (cuda category) when the allocation fails or no GPU is usable. No method leaves a CUDA context current
/// that was not current before; the destructor never throws (a failure to free is logged).
class device_buffer {
 public:
  device_buffer() noexcept = default;
  explicit device_buffer(std::size_t nbytes, int device = 0);
  ~device_buffer();
  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return nbytes_; }
  int device() const noexcept { return device_; }
  buffer_view view() const noexcept { return {ptr_, nbytes_, memory_kind::device, device_}; }

  /// Synchronous copies and fill, for tests and tools (not the fast path).
  void copy_from_host(const void* src, std::size_t nbytes, std::size_t offset_bytes = 0);
  void copy_to_host(void* dst, std::size_t nbytes, std::size_t offset_bytes = 0) const;
  void fill(unsigned char value);

 private:
  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
  int device_ = -1;
};

/// Owning page-locked host memory, portable (usable from every device's context) and mapped into the devices'
/// address space (kernels can read and write it), registered and freed in `device`'s primary context. It is anonymous memory on transparent huge pages where the kernel gives them,
/// registered with cuMemHostRegister, so that O_DIRECT into it pins 2 MiB at a time; if registration is
/// refused it comes from cuMemHostAlloc. Move-only; a moved-from buffer is empty. Throws gdskit::error (cuda
/// category) when the allocation fails or no GPU is usable; the destructor never throws (it logs).
class pinned_buffer {
 public:
  pinned_buffer() noexcept = default;
  explicit pinned_buffer(std::size_t nbytes, int device = 0);
  ~pinned_buffer();
  pinned_buffer(pinned_buffer&& o) noexcept;
  pinned_buffer& operator=(pinned_buffer&& o) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return nbytes_; }
  buffer_view view() const noexcept { return {ptr_, nbytes_, memory_kind::pinned, -1}; }
  /// Bytes of it on transparent huge pages (from /proc/self/smaps; 0 for cuMemHostAlloc memory).
  std::size_t huge_page_bytes() const noexcept;

 private:
  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
  int device_ = -1;
  std::size_t mapped_ = 0;  // bytes to munmap when the memory is registered anonymous memory
};

/// Registers device memory with cuFile for its lifetime (cuFileBufRegister / cuFileBufDeregister).
/// Throws gdskit::error (cufile category) when registration fails. Move-only.
class cufile_registration {
 public:
  cufile_registration() noexcept = default;
  explicit cufile_registration(buffer_view device_memory);
  ~cufile_registration();
  cufile_registration(cufile_registration&& o) noexcept;
  cufile_registration& operator=(cufile_registration&& o) noexcept;
  cufile_registration(const cufile_registration&) = delete;
  cufile_registration& operator=(const cufile_registration&) = delete;
  bool active() const noexcept { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace gdskit
