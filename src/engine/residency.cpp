#include "engine/residency.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

namespace gdskit::engine {

double resident_fraction(int fd, std::uint64_t offset, std::size_t nbytes) {
  if (nbytes == 0) return 1.0;
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = offset / page * page;
  const std::size_t len = static_cast<std::size_t>(offset + nbytes - start);
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> vec((len + page - 1) / page);
  double fraction = -1;
  if (::mincore(map, len, vec.data()) == 0) {
    std::size_t in = 0;
    for (unsigned char v : vec) in += (v & 1u);
    fraction = static_cast<double>(in) / static_cast<double>(vec.size());
  }
  ::munmap(map, len);
  return fraction;
}

bool prefer_page_cache(const file_handle::impl& f, std::uint64_t offset, std::size_t nbytes) {
  if (!f.choice.direct) return true;
  if (f.config.direct == direct_mode::on || f.mode == open_mode::write) return false;
  return resident_fraction(f.fd.get(), offset, nbytes) >= 0.5;
}

}  // namespace gdskit::engine
