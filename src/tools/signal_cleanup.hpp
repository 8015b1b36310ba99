// Files to remove when the process is interrupted (SIGINT, SIGTERM) before it could clean up itself.
#pragma once

#include <cstddef>
#include <filesystem>

namespace gdskit {

/// While alive, `path` is unlinked if the process gets SIGINT or SIGTERM (once install_signal_cleanup() ran); a
/// registered folder is removed after the registered files, once they left it empty.
/// Registering does not remove the file on normal destruction: the owner still decides that. At most
/// kMaxSignalCleanupFiles paths are held at once; beyond that a registration is a no-op (the file is then only
/// removed by its owner). Move-only.
class remove_on_signal {
 public:
  remove_on_signal() noexcept = default;
  explicit remove_on_signal(const std::filesystem::path& path) noexcept;
  ~remove_on_signal();
  remove_on_signal(remove_on_signal&& o) noexcept;
  remove_on_signal& operator=(remove_on_signal&& o) noexcept;
  remove_on_signal(const remove_on_signal&) = delete;
  remove_on_signal& operator=(const remove_on_signal&) = delete;

 private:
  int slot_ = -1;
};

inline constexpr std::size_t kMaxSignalCleanupFiles = 1024;

/// Installs SIGINT and SIGTERM handlers that unlink every registered file, then end the process with exit
/// status 128 + the signal number (130, 143). A signal the process inherited as ignored stays ignored. For
/// programs (the CLI), not for the library.
void install_signal_cleanup();

}  // namespace gdskit
