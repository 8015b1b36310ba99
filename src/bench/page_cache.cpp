// Page-cache residency (mmap + mincore) and dropping a file's pages (posix_fadvise DONTNEED).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "bench/bench.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::bench {

std::optional<double> page_cache_residency(const std::filesystem::path& file, std::string* why) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
    return std::nullopt;
  };
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return say(std::string("open: ") + std::strerror(errno));
  std::error_code ec;
  const auto len = static_cast<std::size_t>(posix::size_of(fd, ec));  // block devices too
  if (ec || len == 0) {
    ::close(fd);
    return say(ec ? "size: " + ec.message() : std::string("empty file"));
  }
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return say(std::string("mmap: ") + std::strerror(errno));
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  int rc = ::mincore(map, len, vec.data());
  int e = errno;
  ::munmap(map, len);
  if (rc != 0) return say(std::string("mincore: ") + std::strerror(e));
  std::size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

std::string drop_page_cache(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("open: ") + std::strerror(errno);
  // Dirty pages cannot be dropped: write them first.
  ::fdatasync(fd);
  int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) return std::string("posix_fadvise DONTNEED: ") + std::strerror(rc);
  return {};
}

std::string fill_page_cache(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("open: ") + std::strerror(errno);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(std::size_t{16} << 20);
  std::error_code ec;
  for (std::uint64_t at = 0;;) {
    const std::size_t n = posix::pread_full(fd, buf.data(), buf.size(), at, ec);
    if (ec || n == 0) break;
    at += n;
  }
  ::close(fd);
  return ec ? "read: " + ec.message() : std::string();
}

}  // namespace gdskit::bench
