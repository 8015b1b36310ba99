// Other programs the tools run (dmesg, nvidia-smi, modinfo, tar, gnuplot, the shell of `setup plan --execute`):
// always by absolute path from a fixed list of system folders, never looked up in $PATH, and started with
// PATH set to that list, so a hostile PATH can neither replace them nor what they run in turn (tar -z runs
// gzip).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gdskit::tools {

/// The folders programs are found in, in this order.
inline constexpr const char* system_program_dirs[] = {"/usr/bin", "/bin", "/usr/sbin", "/sbin"};
/// Where nvidia-smi is also looked for (after the system folders): the driver's own folders in containers
/// and WSL.
inline constexpr const char* nvidia_program_dirs[] = {"/usr/local/nvidia/bin", "/usr/lib/wsl/lib"};
/// The PATH given to the programs started: the system folders.
inline constexpr const char* system_path = "/usr/bin:/bin:/usr/sbin:/sbin";

/// The absolute path of the program `name` (a plain file name, no '/') in the system folders, then in
/// `extra_dirs`: the first that is an executable regular file. nullopt when none is (or `name` is not a plain
/// name). $PATH is never read.
std::optional<std::filesystem::path> find_program(std::string_view name,
                                                  std::span<const char* const> extra_dirs = {});

/// "/usr/bin, /bin, /usr/sbin, /sbin" and `extra_dirs`: the folders find_program searches, for messages.
std::string searched_dirs(std::span<const char* const> extra_dirs = {});

/// This process's environment with PATH replaced by `path` (kept in order otherwise), as "NAME=value" strings.
std::vector<std::string> environment_with_path(std::string_view path);

/// How run_program treats the program's stderr.
enum class stderr_mode { discard, merge };

/// Runs `program` (an absolute path) with `args` and the environment_with_path(system_path): stdin from
/// `stdin_fd` (/dev/null when -1), stdout (and stderr with merge) passed to `on_chunk` as it comes; on_chunk
/// may stop the run by returning an error (the program is then sent SIGTERM). Returns the first error:
/// on_chunk's, a failed start (the errno of posix_spawn), or EIO when the program exits non-zero or is killed.
/// Never throws unless on_chunk does.
std::error_code run_program(const std::filesystem::path& program, const std::vector<std::string>& args, int stdin_fd,
                            stderr_mode err, const std::function<std::error_code(const char*, std::size_t)>& on_chunk);

/// Runs `program` (an absolute path) with `args` attached to this process's terminal (stdin, stdout and stderr
/// inherited), with PATH set to `path` in its environment. Returns its exit status, 128 + the signal that
/// killed it, or 127 when it could not start.
int run_attached(const std::filesystem::path& program, const std::vector<std::string>& args,
                 std::string_view path = system_path);

/// Tests only: while it lives, find_program searches `dirs` instead of the system folders.
class program_dirs_for_testing {
 public:
  explicit program_dirs_for_testing(std::vector<std::string> dirs);
  ~program_dirs_for_testing();
  program_dirs_for_testing(const program_dirs_for_testing&) = delete;
  program_dirs_for_testing& operator=(const program_dirs_for_testing&) = delete;
};

/// What run_captured gives: the output (at most the bytes asked for; the rest is read and dropped) and how the
/// program ended.
struct captured_output {
  std::string text;
  bool capped = false;
  std::error_code error;  ///< run_program's result
  bool ok() const noexcept { return !error; }
};

/// run_program with stdin from /dev/null, keeping at most `max_bytes` of the output.
captured_output run_captured(const std::filesystem::path& program, const std::vector<std::string>& args,
                             std::size_t max_bytes, stderr_mode err = stderr_mode::merge);

}  // namespace gdskit::tools
