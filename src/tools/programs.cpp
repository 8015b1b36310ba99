#include "tools/programs.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "posix/syscalls.hpp"

extern char** environ;

namespace gdskit::tools {
namespace fs = std::filesystem;

namespace {

// Set only by program_dirs_for_testing.
std::optional<std::vector<std::string>>& test_dirs() {
  static std::optional<std::vector<std::string>> dirs;
  return dirs;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// posix_spawn, never posix_spawnp: `program` is absolute and PATH is never searched. Returns its error number.
int spawn(const fs::path& program, const std::vector<std::string>& args, std::string_view path,
          const posix_spawn_file_actions_t* actions, pid_t& pid) {
  std::vector<std::string> argv_s{program.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv = c_strings(argv_s);
  std::vector<std::string> env_s = environment_with_path(path);
  std::vector<char*> envp = c_strings(env_s);
  return ::posix_spawn(&pid, program.c_str(), actions, nullptr, argv.data(), envp.data());
}

}  // namespace

program_dirs_for_testing::program_dirs_for_testing(std::vector<std::string> dirs) { test_dirs() = std::move(dirs); }
program_dirs_for_testing::~program_dirs_for_testing() { test_dirs().reset(); }

std::optional<fs::path> find_program(std::string_view name, std::span<const char* const> extra_dirs) {
  if (name.empty() || name.find('/') != std::string_view::npos || name == "." || name == "..") return std::nullopt;
  auto usable = [&](std::string_view dir) -> std::optional<fs::path> {
    fs::path p = fs::path(dir) / name;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0) return p;
    return std::nullopt;
  };
  if (test_dirs()) {
    for (const auto& d : *test_dirs())
      if (auto p = usable(d)) return p;
    return std::nullopt;
  }
  for (const char* d : system_program_dirs)
    if (auto p = usable(d)) return p;
  for (const char* d : extra_dirs)
    if (auto p = usable(d)) return p;
  return std::nullopt;
}

std::string searched_dirs(std::span<const char* const> extra_dirs) {
  std::string out;
  auto add = [&](std::string_view d) {
    if (!out.empty()) out += ", ";
    out += d;
  };
  if (test_dirs()) {
    for (const auto& d : *test_dirs()) add(d);
    return out;
  }
  for (const char* d : system_program_dirs) add(d);
  for (const char* d : extra_dirs) add(d);
  return out;
}

std::vector<std::string> environment_with_path(std::string_view path) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::string_view(*e).rfind("PATH=", 0) != 0) out.emplace_back(*e);
  }
  out.push_back("PATH=" + std::string(path));
  return out;
}

std::error_code run_program(const fs::path& program, const std::vector<std::string>& args, int stdin_fd,
                            stderr_mode err, const std::function<std::error_code(const char*, std::size_t)>& on_chunk) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {errno, std::generic_category()};
  posix::unique_fd rd(fds[0]), wr(fds[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&fa, stdin_fd, STDIN_FILENO);
  else posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), STDOUT_FILENO);
  if (err == stderr_mode::merge) posix_spawn_file_actions_adddup2(&fa, wr.get(), STDERR_FILENO);
  else posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = spawn(program, args, system_path, &fa, pid);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return {rc, std::generic_category()};
  wr.reset();
  std::error_code first;
  std::array<char, 65536> buf{};
  for (;;) {
    const ssize_t n = ::read(rd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (auto ec = on_chunk(buf.data(), static_cast<std::size_t>(n))) {
      first = ec;
      ::kill(pid, SIGTERM);
      break;
    }
  }
  rd.reset();
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (first) return first;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::make_error_code(std::errc::io_error);
  return {};
}

int run_attached(const fs::path& program, const std::vector<std::string>& args, std::string_view path) {
  pid_t pid = 0;
  if (spawn(program, args, path, nullptr, pid) != 0) return 127;
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return 127;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 127;
}

captured_output run_captured(const fs::path& program, const std::vector<std::string>& args, std::size_t max_bytes,
                             stderr_mode err) {
  captured_output out;
  out.error = run_program(program, args, -1, err, [&](const char* data, std::size_t n) {
    // Read to the end, so the program is not stopped by a full pipe, but keep only the first bytes.
    const std::size_t room = max_bytes - out.text.size();
    if (n > room) out.capped = true;
    out.text.append(data, std::min(n, room));
    return std::error_code{};
  });
  return out;
}

}  // namespace gdskit::tools
