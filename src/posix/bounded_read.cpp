#include "posix/bounded_read.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "posix/fs_info.hpp"
#include "posix/syscalls.hpp"

namespace gdskit {
namespace {

// Accepts only regular files; returns the fd (and its size) or sets `out`.
posix::unique_fd check_regular(posix::unique_fd fd, bounded_text& out, std::uint64_t& size) {
  struct stat st {};
  if (posix::sys().fstat(fd.get(), &st) != 0) {
    out.error = std::error_code(errno, std::generic_category());
    return {};
  }
  if (S_ISDIR(st.st_mode)) {
    out.error = std::make_error_code(std::errc::is_a_directory);
    return {};
  }
  if (!S_ISREG(st.st_mode)) {
    out.error = std::make_error_code(std::errc::invalid_argument);
    out.why = std::string("not a regular file (") + posix::file_kind(st.st_mode) + ")";
    return {};
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// Opens without blocking, then as check_regular.
posix::unique_fd open_regular(const std::filesystem::path& path, bounded_text& out, std::uint64_t& size) {
  std::error_code ec;
  posix::unique_fd fd(posix::open_retry(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0, ec));
  if (!fd) {
    out.error = ec;
    return fd;
  }
  return check_regular(std::move(fd), out, size);
}

}  // namespace

std::string bounded_text::reason() const { return why.empty() ? error.message() : why; }

bounded_text read_bounded(const std::filesystem::path& path, std::size_t max_bytes, bool tail) noexcept {
  bounded_text out;
  std::uint64_t size = 0;
  posix::unique_fd fd = open_regular(path, out, size);
  if (!fd) return out;
  return read_bounded(std::move(fd), max_bytes, tail);
}

bounded_text read_bounded(posix::unique_fd opened, std::size_t max_bytes, bool tail) noexcept {
  bounded_text out;
  try {
    std::uint64_t size = 0;
    posix::unique_fd fd = check_regular(std::move(opened), out, size);
    if (!fd) return out;
    std::uint64_t offset = 0;
    if (tail && size > max_bytes) {
      offset = size - max_bytes;
      out.capped = true;
    }
    std::string text;
    std::array<char, 65536> buf{};
    // One byte past the limit tells a file of exactly max_bytes from a longer one (/proc files report size 0).
    while (text.size() <= max_bytes) {
      const std::size_t want = std::min<std::size_t>(buf.size(), max_bytes + 1 - text.size());
      std::error_code ec;
      const std::size_t got = posix::pread_full(fd.get(), buf.data(), want, offset, ec);
      if (ec) {
        out.error = ec;
        return out;
      }
      text.append(buf.data(), got);
      offset += got;
      if (got < want) break;
    }
    if (text.size() > max_bytes) {
      text.resize(max_bytes);
      out.capped = true;
    }
    out.text = std::move(text);
  } catch (const std::bad_alloc&) {
    out.error = std::make_error_code(std::errc::not_enough_memory);
  }
  return out;
}

bounded_text scan_lines_bounded(const std::filesystem::path& path, std::size_t max_total_bytes,
                                std::size_t max_line_bytes, const std::function<void(std::string_view)>& on_line) {
  bounded_text out;
  std::uint64_t size = 0;
  posix::unique_fd fd = open_regular(path, out, size);
  if (!fd) return out;
  return scan_lines_bounded(std::move(fd), max_total_bytes, max_line_bytes, on_line);
}

bounded_text scan_lines_bounded(posix::unique_fd opened, std::size_t max_total_bytes, std::size_t max_line_bytes,
                                const std::function<void(std::string_view)>& on_line) {
  bounded_text out;
  std::uint64_t size = 0;
  posix::unique_fd fd = check_regular(std::move(opened), out, size);
  if (!fd) return out;
  std::string line;
  bool cutting = false;  // the current line passed max_line_bytes: skip to its end
  std::array<char, 65536> buf{};
  std::uint64_t offset = 0;
  for (;;) {
    if (offset >= max_total_bytes) {
      out.capped = true;
      break;
    }
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), max_total_bytes - offset));
    std::error_code ec;
    const std::size_t got = posix::pread_full(fd.get(), buf.data(), want, offset, ec);
    if (ec) {
      out.error = ec;
      return out;
    }
    offset += got;
    for (std::size_t i = 0; i < got; ++i) {
      const char c = buf[i];
      if (c == '\n') {
        on_line(line);
        line.clear();
        cutting = false;
      } else if (!cutting) {
        if (line.size() < max_line_bytes) {
          line += c;
        } else {
          cutting = true;
        }
      }
    }
    if (got < want) break;
  }
  if (!line.empty()) on_line(line);
  out.text = std::string();
  return out;
}

}  // namespace gdskit
