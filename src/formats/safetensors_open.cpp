// Opening shards and indexes: type checks before the engine opens a file.
#include "formats/safetensors_open.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "posix/fs_info.hpp"

namespace gdskit::formats {
regular_file open_regular(const std::filesystem::path& path) {
  std::error_code ec;
  // Never waiting on a FIFO, a terminal or a lease: posix::open_without_waiting.
  regular_file f;
  struct stat st {};
  f.fd.reset(posix::open_without_waiting(path.c_str(), O_RDONLY, 0, st, ec));
  const auto refuse = [&] {
    throw error(errno_code(EINVAL), "open", path.string(), -1, 0,
                fmt::format("a {}: only regular files are read", posix::file_kind(st.st_mode)));
  };
  if (ec == std::errc::no_such_device_or_address && st.st_mode != 0 && !S_ISREG(st.st_mode)) refuse();  // a socket
  if (ec) throw error(ec, "open", path.string(), -1, 0);
  if (S_ISDIR(st.st_mode)) throw error(errno_code(EISDIR), "open", path.string(), -1, 0, "a folder, not a file");
  if (!S_ISREG(st.st_mode)) refuse();
  f.nbytes = static_cast<std::uint64_t>(st.st_size);
  f.device = st.st_dev;
  f.inode = st.st_ino;
  return f;
}

std::string read_small_file(const std::filesystem::path& path, std::uint64_t limit_bytes) {
  auto f = open_regular(path);
  if (f.nbytes > limit_bytes) {
    throw error(errno_code(EFBIG), "read", path.string(), 0, 0,
                fmt::format("{} bytes; the limit is {}", f.nbytes, limit_bytes));
  }
  std::string text(static_cast<std::size_t>(f.nbytes), '\0');
  std::error_code ec;
  const std::size_t got = posix::pread_full(f.fd.get(), text.data(), text.size(), 0, ec);
  if (ec) throw error(ec, "pread", path.string(), 0, text.size());
  text.resize(got);
  return text;
}

}  // namespace gdskit::formats

namespace gdskit::safetensors {

file_handle open_file(const std::filesystem::path& path, const settings& config) {
  const auto checked = formats::open_regular(path);
  file_handle f(path, open_mode::read, open_options{}, config);
  // The path could have been replaced between the check and the engine's open.
  struct stat st {};
  if (posix::sys().fstat(f.fd(), &st) != 0) throw error(errno_code(errno), "fstat", path.string(), -1, 0);
  if (st.st_dev != checked.device || st.st_ino != checked.inode) {
    throw error(errno_code(EAGAIN), "open", path.string(), -1, 0, "the file was replaced while it was opened");
  }
  return f;
}

}  // namespace gdskit::safetensors
