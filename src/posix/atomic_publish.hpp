// Publishing a file under its final name only once it is whole and on disk: the bytes go to a temporary name in
// the target's folder, then fdatasync, rename over the final name, fsync of the folder. A crash or an error at
// any point leaves the target as it was (the old file or none), never a partial file.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string_view>

namespace gdskit::posix {

/// One file being published. Construct it, create and write temp_path() (the caller opens it, e.g. with
/// O_CREAT | O_EXCL), then commit(). Until commit() has renamed the file, the destructor removes the temporary
/// file, so every error path (exceptions included) leaves no temporary file behind. Move-only.
class atomic_publish {
 public:
  atomic_publish() noexcept = default;
  /// Picks a fresh temporary name "<name>.gdskit-tmp.<random>" next to `target`; creates nothing. When
  /// `overwrite` is false and `target` exists, throws gdskit::error (EEXIST) naming it, before any byte is
  /// written; commit() checks again, atomically.
  atomic_publish(std::filesystem::path target, bool overwrite);
  ~atomic_publish();
  atomic_publish(atomic_publish&& o) noexcept;
  atomic_publish& operator=(atomic_publish&& o) noexcept;
  atomic_publish(const atomic_publish&) = delete;
  atomic_publish& operator=(const atomic_publish&) = delete;

  const std::filesystem::path& target() const noexcept { return target_; }
  const std::filesystem::path& temp_path() const noexcept { return temp_; }
  bool committed() const noexcept { return committed_; }

  /// Makes the temporary file durable and gives it the final name: fdatasync(`fd`) (skipped when `fd` < 0: the
  /// caller synced it), rename over the target (without overwrite: a rename that never replaces, EEXIST if
  /// the target appeared meanwhile), fsync of the folder. Throws gdskit::error (errno) naming the step and
  /// the file; on a failure before the rename the temporary file is removed and the target is untouched.
  void commit(int fd);
  /// Only the data sync of commit(), for callers that publish several files together: sync every file first,
  /// then rename them one after another with rename_and_sync_folder().
  void sync_data(int fd) const;
  /// The rename and folder fsync of commit().
  void rename_and_sync_folder();
  /// The rename of commit() alone, for callers that publish several files of one folder and then sync the
  /// folder once (sync_folder), or not at all when they promise no durability.
  void rename();
  /// Removes the temporary file now (idempotent; ENOENT ignored).
  void discard() noexcept;
  /// Forgets the temporary file without removing it, as a process killed at this point would leave it (for
  /// tests of recovery from interrupted writes).
  void abandon() noexcept { temp_.clear(); }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  bool overwrite_ = false;
  bool committed_ = false;
};

/// fsync of a folder, through the syscall seam. Throws gdskit::error naming it.
void sync_folder(const std::filesystem::path& folder);

/// Writes `data` under a temporary name for `target` and syncs it, without publishing it: the caller calls
/// rename_and_sync_folder() (or drops the result, which removes the file). `mode` is exact (the umask does not
/// narrow it).
atomic_publish write_unpublished(const std::filesystem::path& target, std::string_view data, mode_t mode,
                                 bool overwrite);

/// Writes `data` to `target` through an atomic_publish: created with `mode` (exact, the umask does not narrow
/// it), replacing an existing file only when `overwrite`.
void atomic_write_file(const std::filesystem::path& target, std::string_view data, mode_t mode, bool overwrite);

}  // namespace gdskit::posix
