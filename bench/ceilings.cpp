#include "ceilings.hpp"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/printable.hpp"
#include "posix/anon_memory.hpp"

namespace gdskit::bench_support {
namespace {

constexpr std::size_t kIo = std::size_t{4} << 20;

struct fd_guard {
  int fd;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

int open_or_throw(const std::filesystem::path& p, int flags, mode_t mode = 0644) {
  int fd = ::open(p.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("open " + p.string() + ": " + std::strerror(errno));
  return fd;
}

// The raw ceilings read into the same kind of memory gdskit's pinned lanes use (2 MiB pages where the kernel
// gives them), so that a ceiling is never lower for want of a cheaper buffer.
posix::anon_memory aligned(std::size_t n) { return posix::anon_memory(n); }

}  // namespace

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

namespace {

// What is at `path` now: nothing (false), a regular file of `size` bytes (true); throws for anything else.
bool regular_of_size(const std::filesystem::path& path, std::uint64_t size, const char* what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw std::runtime_error(printable(path.string()) + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error(printable(path.string()) + " is not a regular file (a symbolic link, FIFO, device or folder): " + what);
  }
  if (static_cast<std::uint64_t>(st.st_size) != size) {
    throw std::runtime_error(printable(path.string()) + " exists with " + std::to_string(st.st_size) + " bytes, not " +
                             std::to_string(size) + ": " + what + "; remove it, or give its size");
  }
  return true;
}

}  // namespace

void ensure_file(const std::filesystem::path& path, std::uint64_t nbytes) {
  if (regular_of_size(path, nbytes, "the bench reads a file of random data it makes itself and overwrites none")) return;
  std::vector<std::uint64_t> buf(kIo / 8);  // before the file exists: no empty file is left when it fails
  fd_guard g{open_or_throw(path, O_WRONLY | O_CREAT | O_EXCL)};
  std::mt19937_64 rng(42);
  for (std::uint64_t off = 0; off < nbytes; off += kIo) {
    for (auto& w : buf) w = rng();
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kIo, nbytes - off));
    for (std::size_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(g.fd, reinterpret_cast<const char*>(buf.data()) + done, n - done,
                                 static_cast<off_t>(off + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = w < 0 ? errno : ENOSPC;  // a write that moves nothing: the device is full
        std::error_code ignored;
        std::filesystem::remove(path, ignored);  // no half-made file left to pass for a whole one later
        throw std::runtime_error("write " + path.string() + ": " + std::strerror(e));
      }
      done += static_cast<std::size_t>(w);
    }
  }
  ::fsync(g.fd);
}

void check_scratch(const std::filesystem::path& path, std::uint64_t nbytes) {
  (void)regular_of_size(path, nbytes, "the bench writes and removes this file itself and overwrites none");
}

args_verdict check_args(int argc, char** argv, const char* usage, std::initializer_list<std::string_view> options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return args_verdict::help;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.size() < 2 || a[0] != '-' || std::find(options.begin(), options.end(), a) != options.end()) continue;
    std::fprintf(stderr, "unknown option %s\n%s", printable(a.substr(0, 64)).c_str(), usage);
    return args_verdict::bad;
  }
  return args_verdict::run;
}

std::optional<unsigned long> parse_count(const char* s, unsigned long lo, unsigned long hi) {
  if (s == nullptr) return std::nullopt;
  const std::string_view t(s);
  unsigned long v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

double resident(const std::filesystem::path& path) {
  fd_guard g{open_or_throw(path, O_RDONLY)};
  struct stat st {};
  ::fstat(g.fd, &st);
  if (st.st_size == 0) return 1.0;
  void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, g.fd, 0);
  if (m == MAP_FAILED) return -1;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((static_cast<std::size_t>(st.st_size) + page - 1) / page);
  ::mincore(m, static_cast<std::size_t>(st.st_size), v.data());
  ::munmap(m, static_cast<std::size_t>(st.st_size));
  std::size_t in = 0;
  for (auto c : v) in += c & 1u;
  return static_cast<double>(in) / static_cast<double>(v.size());
}

double drop_cache(const std::filesystem::path& path) {
  fd_guard g{open_or_throw(path, O_RDONLY)};
  ::fdatasync(g.fd);
  ::posix_fadvise(g.fd, 0, 0, POSIX_FADV_DONTNEED);
  return resident(path);
}

double warm_cache(const std::filesystem::path& path) {
  parallel_read(path, 8, false);
  return resident(path);
}

rate parallel_read(const std::filesystem::path& path, unsigned threads, bool direct) {
  fd_guard g{open_or_throw(path, O_RDONLY | (direct ? O_DIRECT : 0))};
  struct stat st {};
  ::fstat(g.fd, &st);
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t slice = (size / threads + kIo - 1) / kIo * kIo;
  std::atomic<bool> failed{false};
  double c0 = cpu_s(), t0 = now_s();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const posix::anon_memory mem = aligned(kIo);
      void* buf = mem.data();
      for (std::uint64_t off = t * slice; off < std::min(size, (t + 1) * slice); off += kIo) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kIo, size - off));
        if (direct) n = (n + 4095) / 4096 * 4096;
        if (::pread(g.fd, buf, n, static_cast<off_t>(off)) < 0) failed = true;
      }
    });
  }
  for (auto& th : pool) th.join();
  double dt = now_s() - t0;
  if (failed) throw std::runtime_error("parallel read of " + path.string() + " failed");
  double gib = static_cast<double>(size) / (1u << 30);
  return {gib / dt, threads, (cpu_s() - c0) / gib};
}

rate parallel_read_into(const std::filesystem::path& path, unsigned threads, std::size_t request_bytes,
                        std::byte* dst) {
  fd_guard g{open_or_throw(path, O_RDONLY | O_DIRECT)};
  struct stat st {};
  ::fstat(g.fd, &st);
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  double c0 = cpu_s(), t0 = now_s();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      // Requests handed out in file order, as an engine with `threads` in flight issues them.
      for (std::uint64_t off = next.fetch_add(request_bytes); off < size; off = next.fetch_add(request_bytes)) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(request_bytes, size - off));
        n = (n + 4095) / 4096 * 4096;
        if (::pread(g.fd, dst + off, n, static_cast<off_t>(off)) < 0) failed = true;
      }
    });
  }
  for (auto& th : pool) th.join();
  double dt = now_s() - t0;
  if (failed) throw std::runtime_error("parallel read of " + path.string() + " failed");
  double gib = static_cast<double>(size) / (1u << 30);
  return {gib / dt, threads, (cpu_s() - c0) / gib};
}

rate best_parallel_read(const std::filesystem::path& path, unsigned max_threads, bool direct, bool cold) {
  rate best;
  for (unsigned t = 1; t <= max_threads; t *= 2) {
    if (cold) drop_cache(path);
    rate r = parallel_read(path, t, direct);
    if (r.gib_s > best.gib_s) best = r;
  }
  return best;
}

rate parallel_write_direct(const std::filesystem::path& path, std::uint64_t nbytes, unsigned threads) {
  // A fresh file every time, as the paths it is compared with write: overwriting blocks that an earlier thread
  // count already allocated skips the allocation and unwritten-extent work a new file pays.
  fd_guard g{open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT)};
  const std::uint64_t slice = (nbytes / threads + kIo - 1) / kIo * kIo;
  std::atomic<bool> failed{false};
  double c0 = cpu_s(), t0 = now_s();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const posix::anon_memory mem = aligned(kIo);
      auto* buf = static_cast<std::uint8_t*>(mem.data());
      std::memset(buf, static_cast<int>(t + 1), kIo);
      for (std::uint64_t off = t * slice; off < std::min(nbytes, (t + 1) * slice); off += kIo) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kIo, nbytes - off));
        if (::pwrite(g.fd, buf, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) failed = true;
      }
    });
  }
  for (auto& th : pool) th.join();
  ::fdatasync(g.fd);
  double dt = now_s() - t0;
  if (failed) throw std::runtime_error("parallel O_DIRECT write of " + path.string() + " failed");
  double gib = static_cast<double>(nbytes) / (1u << 30);
  return {gib / dt, threads, (cpu_s() - c0) / gib};
}

rate best_parallel_write_direct(const std::filesystem::path& path, std::uint64_t nbytes, unsigned max_threads) {
  rate best;
  for (unsigned t = 1; t <= max_threads; t *= 2) {
    rate r = parallel_write_direct(path, nbytes, t);
    if (r.gib_s > best.gib_s) best = r;
  }
  return best;
}

}  // namespace gdskit::bench_support
