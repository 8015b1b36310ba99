// Opening the volumes of a store: a folder (files gdskit-kv.lock and gdskit-kv.data in it, created when
// missing) or a block device; the writer's lock; the superblock read, checked or written.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "gdskit/file.hpp"
#include "gdskit/kv.hpp"
#include "kv/format.hpp"

namespace gdskit::kv::detail {

inline constexpr const char* lock_file_name = "gdskit-kv.lock";
inline constexpr const char* data_file_name = "gdskit-kv.data";

struct opened_volume {
  std::filesystem::path given;      ///< the path as the caller gave it
  std::filesystem::path data_path;  ///< the data file, or the block device
  bool block_device = false;
  std::uint64_t device_bytes = 0;   ///< size of the block device
  /// Holds the writer's lock (flock) while open: the lock file, or the device itself.
  std::shared_ptr<const file_handle> lock;
  /// The volume, read-write; empty for a folder whose data file does not exist yet.
  std::shared_ptr<const file_handle> file;
  page_kind kind = page_kind::blank;
  superblock sb;
};

/// Locks the path and reads its superblock. Throws gdskit::error naming the path: ENOTDIR when it is neither
/// a folder nor a block device, EINVAL when one of the store's files is not a regular file, EBUSY when another
/// process holds the lock (naming it where /proc/locks tells), and open errors (EACCES, EROFS, ...).
opened_volume open_volume(const std::filesystem::path& path, const settings& io);

/// Writes the superblock of a new volume of `geometry`: for a folder as a new data file (written under a
/// temporary name and renamed, so a crash leaves no half-made store), for a block device at its start.
/// `sync`: fdatasync before it counts as made. `preallocate`: reserve the data file's space now (fallocate).
void create_volume(opened_volume& v, const superblock& sb, const layout& geometry, bool sync, bool preallocate,
                   const settings& io);

/// The text of a path or namespace safe to print: control characters and non-ASCII bytes escaped.
std::string printable(std::string_view text);

}  // namespace gdskit::kv::detail
