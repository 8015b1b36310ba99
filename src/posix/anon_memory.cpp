#include "posix/anon_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "gdskit/error.hpp"

namespace gdskit::posix {
namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;

}  // namespace

anon_memory::anon_memory(std::size_t nbytes) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  nbytes_ = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
  // Over-map by one huge page so a 2 MiB-aligned start fits; the slack is returned right away.
  map_bytes_ = nbytes_ + kHuge;
  void* m = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    nbytes_ = map_bytes_ = 0;
    throw error(errno_code(e), "mmap", "", -1, nbytes, "anonymous memory for I/O buffers");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  const std::size_t head = start - base;
  const std::size_t tail = map_bytes_ - head - nbytes_;
  if (head != 0) ::munmap(m, head);
  if (tail != 0) ::munmap(reinterpret_cast<void*>(start + nbytes_), tail);
  map_ = ptr_ = reinterpret_cast<void*>(start);
  map_bytes_ = nbytes_;
  // Advice only: a kernel without THP (or with it set to never) still gives 4 KiB pages.
  (void)::madvise(ptr_, nbytes_, MADV_HUGEPAGE);
  // Fault the pages in now, so that no I/O pays for it later: MADV_POPULATE_WRITE where the kernel has it
  // (5.14), else a write to each page (the memory is zero already, so zeros change nothing).
  if (::madvise(ptr_, nbytes_, MADV_POPULATE_WRITE) != 0) {
    auto* b = static_cast<volatile unsigned char*>(ptr_);
    for (std::size_t off = 0; off < nbytes_; off += page) b[off] = 0;
  }
}

anon_memory::~anon_memory() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

void* anon_memory::release() noexcept {
  map_ = nullptr;
  map_bytes_ = nbytes_ = 0;
  return std::exchange(ptr_, nullptr);
}

anon_memory::anon_memory(anon_memory&& o) noexcept
    : map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      nbytes_(std::exchange(o.nbytes_, 0)) {}

anon_memory& anon_memory::operator=(anon_memory&& o) noexcept {
  if (this != &o) {
    anon_memory old(std::move(*this));
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
  }
  return *this;
}

std::string transparent_hugepage_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  return line;
}

std::size_t huge_page_bytes(const void* p) noexcept {
  std::FILE* f = std::fopen("/proc/self/smaps", "re");
  if (f == nullptr) return 0;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  char line[512];
  bool inside = false;
  std::size_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    std::uintmax_t lo = 0;
    std::uintmax_t hi = 0;
    // A mapping's header line: "lo-hi perms offset dev inode [path]" (hex addresses).
    if (std::sscanf(line, "%jx-%jx ", &lo, &hi) == 2 && std::strchr(line, '-') != nullptr &&
        std::strncmp(line, "AnonHugePages", 13) != 0) {
      if (inside) break;  // the mapping ended without the field
      inside = addr >= lo && addr < hi;
      continue;
    }
    std::size_t v = 0;
    if (inside && std::sscanf(line, "AnonHugePages: %zu kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace gdskit::posix
