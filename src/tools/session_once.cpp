#include "tools/session_once.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace gdskit::tools {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line.substr(0, 256);
}

// Field 22 of /proc/PID/stat (start time in clock ticks after boot); the command name before it may hold
// spaces and parentheses, so fields are counted after its last ')'.
std::string start_time(pid_t pid) {
  const std::string stat = first_line(fmt::format("/proc/{}/stat", pid).c_str());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return field;
  }
  return {};
}

// A folder that is absolute, or nothing.
std::filesystem::path absolute_env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '/' ? std::filesystem::path(v) : std::filesystem::path();
}

// "<the boot id's first 16 hex digits>-": the prefix of this boot's markers ("-" alone where it is unknown).
std::string boot_prefix() {
  std::string id;
  for (char c : first_line("/proc/sys/kernel/random/boot_id")) {
    if (std::isxdigit(static_cast<unsigned char>(c)) && id.size() < 16) id += c;
  }
  return id + "-";
}

}  // namespace

std::string session_key() {
  const pid_t sid = ::getsid(0);
  return fmt::format("{}{}-{}", boot_prefix(), sid, start_time(sid));
}

std::filesystem::path session_marker_dir() {
  if (auto run = absolute_env("XDG_RUNTIME_DIR"); !run.empty()) return run / "gdskit";
  if (auto cache = absolute_env("XDG_CACHE_HOME"); !cache.empty()) return cache / "gdskit" / "sessions";
  if (auto home = absolute_env("HOME"); !home.empty()) return home / ".cache" / "gdskit" / "sessions";
  return {};
}

bool first_in_session(std::string_view what) noexcept {
  try {
    const std::filesystem::path dir = session_marker_dir();
    if (dir.empty()) return true;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return true;
    // Only a real folder of this user's (not a link, not another user's folder in a shared place that a
    // variable named) holds markers; anything else and the note is simply said.
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) return true;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && ::chmod(dir.c_str(), 0700) != 0) return true;
    const std::string prefix = fmt::format("{}-", what);
    // Markers of earlier boots name sessions that are gone (the runtime folder is emptied at logout anyway).
    const std::string boot = prefix + boot_prefix();
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code gone;
      if (name.starts_with(prefix) && !name.starts_with(boot)) std::filesystem::remove(it->path(), gone);
    }
    const std::filesystem::path marker = dir / (prefix + session_key());
    const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    return errno != EEXIST;
  } catch (...) {
    return true;
  }
}

}  // namespace gdskit::tools
