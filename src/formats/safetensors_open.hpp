// Opening the files a safetensors load names (shards, indexes) without blocking on FIFOs or devices.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "posix/syscalls.hpp"

namespace gdskit::formats {

/// A checked, open regular file and what fstat said of it.
struct regular_file {
  posix::unique_fd fd;
  std::uint64_t nbytes = 0;
  dev_t device = 0;
  ino_t inode = 0;
};

/// Opens `path` read-only with O_NONBLOCK (so a FIFO cannot hang the open) and refuses anything but a regular
/// file, naming the path: EISDIR for a folder, EINVAL for a FIFO, socket or character device, and for a block
/// device too (the engine sizes files with fstat, which says 0 for those). Open errors keep their errno.
regular_file open_regular(const std::filesystem::path& path);

/// The whole of a small regular file (an index); EFBIG when it holds more than `limit_bytes`.
std::string read_small_file(const std::filesystem::path& path, std::uint64_t limit_bytes);

}  // namespace gdskit::formats
