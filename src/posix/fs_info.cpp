#include "posix/fs_info.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "posix/syscalls.hpp"

namespace gdskit::posix {

const char* file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "folder";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  return "special file";
}

std::string fs_type_name(std::int64_t magic) {
  switch (static_cast<std::uint32_t>(magic)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x01021994: return "tmpfs";
    case 0x9123683E: return "btrfs";
    case 0x6969: return "nfs";
    case 0x794C7630: return "overlayfs";
    case 0x65735546: return "fuse";  // FUSE_SUPER_MAGIC; virtiofs is FUSE and reports this magic too
    case 0x2FC12FC1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x858458F6: return "ramfs";
    case 0x9FA0: return "proc";
    case 0x62656572: return "sysfs";
    case 0x4D44: return "vfat";
    case 0x2011BAB0: return "exfat";
    case 0x5346544E: return "ntfs";
    case 0x0BD00BD0: return "lustre";
    case 0x47504653: return "gpfs";
    case 0x19830326: return "beegfs";
    case 0xFF534D42: return "cifs";
    case 0x6E667364: return "nfsd";  // NFSD_MAGIC: the nfsd control file system, not a data file system
    default: return fmt::format("0x{:x}", static_cast<std::uint32_t>(magic));
  }
}

std::string fs_type_of(int fd) {
  struct statfs st {};
  if (sys().fstatfs(fd, &st) != 0) return "unknown";
  return fs_type_name(static_cast<std::int64_t>(st.f_type));
}

std::size_t direct_alignment(int fd) {
  std::size_t align = std::max<std::size_t>(4096, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
#if defined(STATX_DIOALIGN)
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) != 0) {
    align = std::max<std::size_t>(align, stx.stx_dio_offset_align);
    align = std::max<std::size_t>(align, stx.stx_dio_mem_align);
  }
#else
  (void)fd;
#endif
  return align;
}

}  // namespace gdskit::posix
