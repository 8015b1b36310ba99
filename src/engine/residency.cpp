#include "engine/residency.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <vector>

namespace gdskit::engine {
namespace {

const std::size_t page_bytes = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

}  // namespace

double resident_fraction(const open_file& f, std::uint64_t offset, std::size_t nbytes) {
  if (nbytes == 0) return 1.0;
  if (f.mode == open_mode::write) return -1;  // PROT_READ needs read access
  const std::uint64_t end = offset + nbytes;
  auto& m = f.rmap;
  {
    std::shared_lock lock(m.mutex);
    if (m.addr == nullptr || m.nbytes < end) {
      lock.unlock();
      std::unique_lock wlock(m.mutex);
      if (m.addr == nullptr || m.nbytes < end) {
        if (m.addr != nullptr) ::munmap(m.addr, m.nbytes);
        m.addr = nullptr;
        // Map a little beyond the request so a growing file does not remap on every call.
        const std::size_t len = static_cast<std::size_t>((end + end / 8 + page_bytes - 1) / page_bytes * page_bytes);
        void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, f.fd.get(), 0);
        if (p == MAP_FAILED) return -1;
        m.addr = p;
        m.nbytes = len;
      }
    }
  }
  std::shared_lock lock(m.mutex);
  const std::uint64_t start = offset / page_bytes * page_bytes;
  const std::size_t len = static_cast<std::size_t>(end - start);
  std::vector<unsigned char> vec((len + page_bytes - 1) / page_bytes);
  if (::mincore(static_cast<std::byte*>(m.addr) + start, len, vec.data()) != 0) return -1;
  std::size_t in = 0;
  for (unsigned char v : vec) in += (v & 1u);
  return static_cast<double>(in) / static_cast<double>(vec.size());
}

double sampled_resident_fraction(const open_file& f, std::uint64_t offset, std::size_t nbytes) {
  constexpr std::size_t kWindows = 32;
  constexpr std::size_t kWindowBytes = 256 * 1024;
  if (nbytes <= kWindows * kWindowBytes * 2) return resident_fraction(f, offset, nbytes);
  double sum = 0;
  const std::size_t stride = (nbytes - kWindowBytes) / (kWindows - 1);
  for (std::size_t i = 0; i < kWindows; ++i) {
    double r = resident_fraction(f, offset + i * stride, kWindowBytes);
    if (r < 0) return -1;
    sum += r;
  }
  return sum / kWindows;
}

void release_residency_map(const open_file& f) noexcept {
  std::unique_lock lock(f.rmap.mutex);
  if (f.rmap.addr != nullptr) ::munmap(f.rmap.addr, f.rmap.nbytes);
  f.rmap.addr = nullptr;
  f.rmap.nbytes = 0;
}

bool prefer_page_cache(const open_file& f, std::uint64_t offset, std::size_t nbytes) {
  if (!f.choice.direct) return true;
  if (f.config.direct == direct_mode::on || f.mode == open_mode::write) return false;
  return sampled_resident_fraction(f, offset, nbytes) >= 0.5;
}

}  // namespace gdskit::engine
