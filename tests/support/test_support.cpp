#include "test_support.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace gdskit::test {

temp_dir::temp_dir(const std::filesystem::path& parent) {
  std::filesystem::path base = parent;
  if (base.empty()) {
    const char* t = std::getenv("TMPDIR");
    base = (t != nullptr && *t != '\0') ? t : "/tmp";
  }
  std::string templ = (base / "gdskit-test-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed under " + base.string());
  path_ = templ;
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> out(n);
  std::mt19937_64 rng(seed);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  std::uint64_t v = rng();
  for (std::size_t k = 0; i < n; ++i, ++k) out[i] = static_cast<std::uint8_t>(v >> (8 * k));
  return out;
}

void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

file_handle open_for_seam(const std::filesystem::path& path, const std::vector<std::uint8_t>& data) {
  write_file(path, data);
  settings s;
  s.engine = engine_kind::threads;
  s.direct = direct_mode::off;
  return file_handle(path, open_mode::read, {}, s);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  off_t off = 0;
  for (;;) {
    ssize_t r = ::pread(fd, buf, sizeof buf, off);
    if (r <= 0) break;
    out.insert(out.end(), buf, buf + r);
    off += r;
  }
  ::close(fd);
  return out;
}

static bool accepts_direct(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return false;
  std::string templ = (dir / "gdskit-probe-XXXXXX").string();
  int fd = ::mkstemp(templ.data());
  if (fd < 0) return false;
  ::close(fd);
  int dfd = ::open(templ.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  ::unlink(templ.c_str());
  if (dfd < 0) return false;
  ::close(dfd);
  return true;
}

std::filesystem::path direct_capable_parent() {
  for (const char* c : {static_cast<const char*>(std::getenv("TMPDIR")), "/var/tmp", "/tmp"}) {
    if (c != nullptr && *c != '\0' && accepts_direct(c)) return c;
  }
  return {};
}

std::filesystem::path direct_refusing_parent() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && !accepts_direct("/dev/shm")) return "/dev/shm";
  return {};
}

posix::syscall_table slow_preads(std::function<std::chrono::nanoseconds(off_t offset)> hold) {
  posix::syscall_table t = posix::real_syscalls();
  t.pread = [real = t.pread, hold = std::move(hold)](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
    std::this_thread::sleep_for(hold(o));
    return real(fd, b, n, o);
  };
  return t;
}

posix::syscall_table counting_syscalls(std::atomic<int>& calls) {
  posix::syscall_table t = posix::real_syscalls();
  t.pread = [&calls](int fd, void* b, std::size_t n, off_t o) {
    ++calls;
    return posix::real_syscalls().pread(fd, b, n, o);
  };
  t.pwrite = [&calls](int fd, const void* b, std::size_t n, off_t o) {
    ++calls;
    return posix::real_syscalls().pwrite(fd, b, n, o);
  };
  t.ftruncate = [&calls](int fd, off_t n) {
    ++calls;
    return posix::real_syscalls().ftruncate(fd, n);
  };
  t.uring_result = [&calls](bool w, int fd, std::uint64_t o, std::size_t n, int r) {
    ++calls;
    return posix::real_syscalls().uring_result(w, fd, o, n, r);
  };
  return t;
}

}  // namespace gdskit::test
