// --capture writes the files the checks read and the command outputs as a tar.gz made by /bin/tar from a
// staging folder (no archive library is available on the target machines); --root ARCHIVE reads one back
// into a private folder after checking every member.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <functional>

#include "doctor/doctor.hpp"
#include "posix/syscalls.hpp"

extern char** environ;

namespace gdskit::doctor {
namespace fs = std::filesystem;

namespace {

const char* tar_program() { return ::access("/bin/tar", X_OK) == 0 ? "/bin/tar" : "/usr/bin/tar"; }

// Runs tar with `args`, passing what it writes on stdout to `on_chunk` (which may stop the run by returning an
// error). Returns the first error: on_chunk's, a failed start, or EIO when tar exits non-zero.
std::error_code run_tar(const std::vector<std::string>& args,
                        const std::function<std::error_code(const char*, std::size_t)>& on_chunk) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {errno, std::generic_category()};
  posix::unique_fd rd(fds[0]), wr(fds[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), STDOUT_FILENO);
  // tar's own complaints would only repeat what the returned error and `why` say.
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> argv_s{"tar"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, tar_program(), &fa, nullptr, argv.data(), environ);
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

// Creates or replaces `p` with `data` through the syscall seam, so a full disk reads ENOSPC.
std::error_code write_file(const fs::path& p, std::string_view data) {
  std::error_code ec;
  posix::unique_fd fd(posix::open_retry(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644, ec));
  if (!fd) return ec;
  posix::pwrite_full(fd.get(), data.data(), data.size(), 0, ec);
  return ec;
}

}  // namespace

private_folder::private_folder() {
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / "gdskit-doctor-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    error_ = {errno, std::generic_category()};
    return;
  }
  path_ = tmpl;
}

private_folder::~private_folder() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::error_code write_capture(const system_root& root, const std::string& path, const fs::path& out) {
  private_folder stage;
  if (stage.error()) return stage.error();
  std::error_code ec;
  auto files = root.recorded();
  files["commands/doctor-path.txt"] = path + "\n";
  for (const auto& [rel, content] : files) {
    // Paths come from the checks themselves; still refuse anything that could escape the staging folder.
    if (rel.find("..") != std::string::npos) continue;
    std::string r = rel;
    while (!r.empty() && r.front() == '/') r.erase(0, 1);
    fs::path dst = stage.path() / r;
    fs::create_directories(dst.parent_path(), ec);
    if (ec) return ec;
    if ((ec = write_file(dst, content))) return ec;
  }
  // tar writes the archive to a pipe and gdskit writes the file, so a full disk is reported as ENOSPC and the
  // partial archive removed, never left as a truncated file.
  posix::unique_fd fd(posix::open_retry(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644, ec));
  if (!fd) return ec;
  std::uint64_t offset = 0;
  ec = run_tar({"-czf", "-", "-C", stage.path().string(), "."}, [&](const char* data, std::size_t n) {
    std::error_code wec;
    posix::pwrite_full(fd.get(), data, n, offset, wec);
    offset += n;
    return wec;
  });
  if (!ec && posix::sys().fdatasync(fd.get()) != 0) ec = {errno, std::generic_category()};
  fd.reset();
  if (ec) ::unlink(out.c_str());
  return ec;
}

std::error_code extract_capture(const fs::path& archive, const fs::path& dest, std::string& why) {
  constexpr std::size_t max_members = 100000;
  constexpr std::uint64_t max_total_bytes = 512ull << 20;
  const std::string a = archive.string();
  auto bad = [&](std::string text) {
    why = std::move(text);
    return std::make_error_code(std::errc::invalid_argument);
  };
  // First the listing: only folders and regular files, relative names without "..", bounded sizes.
  std::string listing;
  auto collect = [&](const char* d, std::size_t n) {
    if (listing.size() + n > (64u << 20)) return std::make_error_code(std::errc::file_too_large);
    listing.append(d, n);
    return std::error_code{};
  };
  if (auto ec = run_tar({"-tvzf", a, "--quoting-style=escape"}, collect)) return why = "not a readable .tar.gz", ec;
  std::size_t members = 0;
  std::uint64_t total = 0;
  for (std::size_t pos = 0; pos < listing.size();) {
    auto nl = listing.find('\n', pos);
    if (nl == std::string::npos) nl = listing.size();
    const std::string_view line(listing.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    if (++members > max_members) return bad("more than 100000 members");
    if (line[0] != '-' && line[0] != 'd') return bad("holds a link or special file: " + std::string(line.substr(0, 200)));
    // "-rw-r--r-- user/group SIZE date time name": the third field is the size.
    std::size_t f = 0, i = 0;
    while (i < line.size() && f < 2) {
      while (i < line.size() && line[i] != ' ') ++i;
      while (i < line.size() && line[i] == ' ') ++i;
      ++f;
    }
    std::uint64_t size = 0;
    auto [p, ec] = std::from_chars(line.data() + i, line.data() + line.size(), size);
    if (ec != std::errc()) return bad("unexpected listing line: " + std::string(line.substr(0, 200)));
    if ((total += size) > max_total_bytes) return bad("unpacks to more than 512 MiB");
  }
  listing.clear();
  if (auto ec = run_tar({"-tzf", a, "--quoting-style=escape"}, collect)) return why = "not a readable .tar.gz", ec;
  for (std::size_t pos = 0; pos < listing.size();) {
    auto nl = listing.find('\n', pos);
    if (nl == std::string::npos) nl = listing.size();
    const std::string name = listing.substr(pos, nl - pos);
    pos = nl + 1;
    if (name.empty()) continue;
    if (name[0] == '/') return bad("member with an absolute path: " + name.substr(0, 200));
    for (const auto& part : fs::path(name))
      if (part == "..") return bad("member with '..': " + name.substr(0, 200));
  }
  if (auto ec = run_tar({"-xzf", a, "-C", dest.string(), "--no-same-owner", "--no-same-permissions"},
                        [](const char*, std::size_t) { return std::error_code{}; }))
    return why = "could not be unpacked", ec;
  // The archive could have changed between listing and unpacking: check what is on disk too.
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dest, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const auto st = it->symlink_status(ec);
    if (ec) break;
    if (!fs::is_directory(st) && !fs::is_regular_file(st)) return bad("unpacked a link or special file");
  }
  if (ec) return why = "could not be checked after unpacking", ec;
  return {};
}

}  // namespace gdskit::doctor
