// Anonymous memory for O_DIRECT buffers, backed by transparent huge pages where the kernel gives them.
//
// An O_DIRECT request pins and later releases every page of its buffer; with 2 MiB pages the kernel does that
// once per 2 MiB instead of once per 4 KiB. Measured on a RAM-backed loop device (1 GiB cold reads, one
// thread): 1 MiB requests cost 0.069 CPU-s/GiB into 4 KiB pages and 0.036 into 2 MiB pages, 8 MiB requests
// 0.028 and 0.008.
#pragma once

#include <cstddef>
#include <string>

namespace gdskit::posix {

/// Private anonymous memory: 2 MiB aligned, advised for transparent huge pages (MADV_HUGEPAGE) and faulted in
/// when constructed. Move-only; throws gdskit::error (ENOMEM) when the mapping fails. Whether huge pages back
/// it depends on /sys/kernel/mm/transparent_hugepage (never, madvise, always) and on free memory.
class anon_memory {
 public:
  anon_memory() noexcept = default;
  explicit anon_memory(std::size_t nbytes);
  ~anon_memory();
  anon_memory(anon_memory&& o) noexcept;
  anon_memory& operator=(anon_memory&& o) noexcept;
  anon_memory(const anon_memory&) = delete;
  anon_memory& operator=(const anon_memory&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return nbytes_; }
  /// Gives up ownership: the caller unmaps [data(), data() + size()) with munmap.
  void* release() noexcept;

 private:
  void* map_ = nullptr;     // what mmap returned
  std::size_t map_bytes_ = 0;
  void* ptr_ = nullptr;     // 2 MiB-aligned start inside it
  std::size_t nbytes_ = 0;
};

/// The line of /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never"); empty when the kernel
/// has no such file.
std::string transparent_hugepage_mode();

/// Bytes of the mapping that holds `p` that are backed by transparent huge pages (AnonHugePages in
/// /proc/self/smaps); 0 when none or unknown.
std::size_t huge_page_bytes(const void* p) noexcept;

}  // namespace gdskit::posix
