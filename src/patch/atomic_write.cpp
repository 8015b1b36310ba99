// Replacing a driver source file so that a crash at any point leaves either the old or the new bytes, never a mix.
#include <sys/stat.h>

#include <mutex>

#include "patch/patch.hpp"
#include "posix/atomic_publish.hpp"

namespace gdskit::patch {
namespace {

std::mutex hook_mutex;
before_rename_hook& hook() {
  static before_rename_hook h;
  return h;
}

}  // namespace

void set_before_rename_hook(before_rename_hook h) {
  std::lock_guard lock(hook_mutex);
  hook() = std::move(h);
}

void atomic_write(const std::filesystem::path& target, std::string_view data) {
  // The replacement keeps the original's mode.
  mode_t mode = 0644;
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) mode = st.st_mode & 07777;
  posix::atomic_publish pub = posix::write_unpublished(target, data, mode, /*overwrite=*/true);

  before_rename_hook h;
  {
    std::lock_guard lock(hook_mutex);
    h = hook();
  }
  if (h) {
    try {
      h(pub.temp_path(), target);
    } catch (const simulated_kill&) {
      pub.abandon();  // a killed process removes nothing: the temporary file stays for recovery to find
      throw;
    }  // any other exception leaves pub to remove the temporary file
  }
  pub.rename_and_sync_folder();
}

}  // namespace gdskit::patch
