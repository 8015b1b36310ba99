// --capture: the files the checks read and the command outputs, as a tar.gz made by /bin/tar from a
// staging folder (no archive library is available on the target machines).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "doctor/doctor.hpp"

extern char** environ;

namespace gdskit::doctor {
namespace fs = std::filesystem;

std::error_code write_capture(const system_root& root, const std::string& path, const fs::path& out) {
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / "gdskit-capture-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return {errno, std::generic_category()};
  const fs::path stage = tmpl;
  auto cleanup = [&] {
    std::error_code rc;
    fs::remove_all(stage, rc);
  };
  for (const auto& [rel, content] : root.recorded()) {
    // Paths come from the checks themselves; still refuse anything that could escape the staging folder.
    if (rel.find("..") != std::string::npos) continue;
    std::string r = rel;
    while (!r.empty() && r.front() == '/') r.erase(0, 1);
    fs::path dst = stage / r;
    fs::create_directories(dst.parent_path(), ec);
    if (ec) {
      cleanup();
      return ec;
    }
    std::ofstream f(dst, std::ios::binary);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!f) {
      cleanup();
      return std::make_error_code(std::errc::io_error);
    }
  }
  {
    fs::create_directories(stage / "commands", ec);
    std::ofstream p(stage / "commands" / "doctor-path.txt");
    p << path << "\n";
  }
  fs::path out_abs = fs::absolute(out, ec);
  std::string out_s = out_abs.string(), stage_s = stage.string();
  const char* argv[] = {"tar", "-czf", out_s.c_str(), "-C", stage_s.c_str(), ".", nullptr};
  pid_t pid = 0;
  const char* tar = ::access("/bin/tar", X_OK) == 0 ? "/bin/tar" : "/usr/bin/tar";
  int rc = ::posix_spawn(&pid, tar, nullptr, nullptr, const_cast<char* const*>(argv), environ);
  if (rc != 0) {
    cleanup();
    return {rc, std::generic_category()};
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  cleanup();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::make_error_code(std::errc::io_error);
  return {};
}

}  // namespace gdskit::doctor
