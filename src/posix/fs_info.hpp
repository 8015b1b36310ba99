// What the kernel says about the file system and alignment of an open file.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdskit::posix {

/// Name of a file system from its statfs magic ("ext4", "xfs", "tmpfs", ...), or "0x<magic>".
std::string fs_type_name(std::int64_t magic);

/// What kind of file `mode` (st_mode) is, for messages: "regular file", "folder", "FIFO", "socket",
/// "character device", "block device" or "special file".
const char* file_kind(mode_t mode) noexcept;

/// File system type of an open file ("unknown" when fstatfs fails).
std::string fs_type_of(int fd);

/// O_DIRECT alignment for offsets and memory: the kernel's STATX_DIOALIGN where reported, never below the
/// page size (so a buffered write of a partial block never shares a page with an O_DIRECT write).
std::size_t direct_alignment(int fd);

}  // namespace gdskit::posix
