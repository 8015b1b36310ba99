// --capture writes the files the checks read and the command outputs as a tar.gz made by tar(1) from a
// staging folder (no archive library is available on the target machines); --root ARCHIVE reads one back
// into a private folder through gzip and tar_reader, which checks every header before its member is written.
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

#include "tools/shell_text.hpp"
#include "doctor/doctor.hpp"
#include "doctor/tar_reader.hpp"
#include "posix/syscalls.hpp"

extern char** environ;

namespace gdskit::doctor {
namespace fs = std::filesystem;

namespace {

// A program by absolute path: never looked up in $PATH, never given a name it could read as an option or a
// remote host.
const char* program_path(const char* name) {
  static const char* const dirs[] = {"/usr/bin/", "/bin/"};
  static thread_local std::string found;
  for (const char* d : dirs) {
    found = std::string(d) + name;
    if (::access(found.c_str(), X_OK) == 0) return found.c_str();
  }
  found = std::string("/usr/bin/") + name;
  return found.c_str();
}

// Runs `program` with `args`, stdin from `stdin_fd` (or /dev/null when -1), passing what it writes on stdout to
// `on_chunk` (which may stop the run by returning an error). Returns the first error: on_chunk's, a failed
// start, or EIO when the program exits non-zero.
std::error_code run_program(const char* program, const std::vector<std::string>& args, int stdin_fd,
                            const std::function<std::error_code(const char*, std::size_t)>& on_chunk) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {errno, std::generic_category()};
  posix::unique_fd rd(fds[0]), wr(fds[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&fa, stdin_fd, STDIN_FILENO);
  else posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), STDOUT_FILENO);
  // The program's own complaints would only repeat what the returned error and `why` say.
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, program, &fa, nullptr, argv.data(), environ);
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
  std::string why;
  return write_capture(root, path, out, why);
}

std::error_code write_capture(const system_root& root, const std::string& path, const fs::path& out, std::string& why) {
  auto failed = [&](std::error_code ec, const std::string& what) {
    why = what + ": " + ec.message();
    return ec;
  };
  private_folder stage;
  if (stage.error()) return failed(stage.error(), "cannot make a staging folder under $TMPDIR");
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
    if (ec) return failed(ec, "cannot stage it under $TMPDIR");
    if ((ec = write_file(dst, content))) return failed(ec, "cannot stage it under $TMPDIR");
  }
  // tar writes the archive to a pipe and gdskit writes the file, so a full disk is reported as ENOSPC and the
  // partial archive removed, never left as a truncated file. O_NONBLOCK: a FIFO without a reader is refused,
  // not waited on.
  posix::unique_fd fd(posix::open_retry(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644, ec));
  if (!fd) {
    std::error_code pec;
    const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
    if (ec == std::errc::no_such_file_or_directory && !fs::exists(parent, pec)) {
      why = "cannot create it: the folder " + printable(parent.string()) + " does not exist";
      return ec;
    }
    if (const auto st = fs::status(out, pec); !pec && fs::exists(st) && !fs::is_regular_file(st)) {
      why = "not a regular file: --capture writes a new .tar.gz file";
      return std::make_error_code(std::errc::invalid_argument);
    }
    return failed(ec, "cannot create it");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file: --capture writes a new .tar.gz file";
    return std::make_error_code(std::errc::invalid_argument);
  }
  std::uint64_t offset = 0;
  const char* tar = program_path("tar");
  ec = run_program(tar, {"-czf", "-", "-C", fs::absolute(stage.path()).string(), "."}, -1,
                   [&](const char* data, std::size_t n) {
    std::error_code wec;
    posix::pwrite_full(fd.get(), data, n, offset, wec);
    offset += n;
    return wec;
  });
  if (!ec && posix::sys().fdatasync(fd.get()) != 0) ec = {errno, std::generic_category()};
  fd.reset();
  if (ec) {
    ::unlink(out.c_str());
    if (ec == std::errc::io_error) why = std::string(tar) + " failed to write the archive";
    else if (ec == std::errc::no_such_file_or_directory) why = std::string(tar) + " could not be run: " + ec.message();
    else why = ec.message();
  }
  return ec;
}

namespace {

// Writes the members of a capture archive under a fresh folder. Every file is created with O_EXCL and
// O_NOFOLLOW relative to folders this sink created itself, so nothing is written outside `dest` and no
// member replaces another.
class unpack_sink final : public tar_sink {
 public:
  explicit unpack_sink(const fs::path& dest) : root_(::open(dest.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)) {}
  bool ok() const { return static_cast<bool>(root_); }

  std::error_code begin(const tar_member& m) override {
    offset_ = 0;
    std::error_code ec;
    const auto slash = m.name.rfind('/');
    posix::unique_fd parent = folder(m.directory ? m.name : (slash == std::string::npos ? "" : m.name.substr(0, slash)), ec);
    if (ec || m.directory) return ec;
    const std::string leaf = slash == std::string::npos ? m.name : m.name.substr(slash + 1);
    file_.reset(::openat(parent.get(), leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!file_) return {errno, std::generic_category()};
    return {};
  }
  std::error_code data(std::string_view bytes) override {
    std::error_code ec;
    posix::pwrite_full(file_.get(), bytes.data(), bytes.size(), offset_, ec);
    offset_ += bytes.size();
    return ec;
  }
  std::error_code end() override { return file_.close(); }

 private:
  // Opens (creating as needed) the folder `rel` under the root, one component at a time.
  posix::unique_fd folder(const std::string& rel, std::error_code& ec) {
    posix::unique_fd cur(::dup(root_.get()));
    std::size_t i = 0;
    while (i < rel.size()) {
      auto j = rel.find('/', i);
      if (j == std::string::npos) j = rel.size();
      const std::string part = rel.substr(i, j - i);
      i = j + 1;
      if (::mkdirat(cur.get(), part.c_str(), 0755) != 0 && errno != EEXIST) {
        ec = {errno, std::generic_category()};
        return {};
      }
      posix::unique_fd next(::openat(cur.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!next) {
        ec = {errno, std::generic_category()};
        return {};
      }
      cur = std::move(next);
    }
    return cur;
  }

  posix::unique_fd root_;
  posix::unique_fd file_;
  std::uint64_t offset_ = 0;
};

// Removes what a refused archive left in `dest`, keeping the folder itself.
void empty_folder(const fs::path& dest) {
  std::error_code ec;
  for (fs::directory_iterator it(dest, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rec;
    fs::remove_all(it->path(), rec);
  }
}

}  // namespace

std::error_code extract_capture(const fs::path& archive, const fs::path& dest, std::string& why,
                                const tar_limits& limits) {
  // The archive is opened here and handed to gzip as its standard input: no program ever sees its name, so a
  // name with a colon (a timestamp) is a local file, and one that starts with '-' is not an option.
  std::error_code ec;
  posix::unique_fd in(posix::open_retry(archive.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0, ec));
  if (!in) return why = "cannot be opened", ec;
  struct stat st {};
  if (::fstat(in.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
    return std::make_error_code(std::errc::invalid_argument);
  }
  unpack_sink sink(dest);
  if (!sink.ok()) return why = "the private folder could not be opened", std::error_code(errno, std::generic_category());
  tar_reader reader(sink, limits);
  ec = run_program(program_path("gzip"), {"-dc"}, in.get(), [&](const char* d, std::size_t n) -> std::error_code {
    if (auto e = reader.feed({d, n})) return e;
    // Whatever follows the end of the archive is not read (and cannot fill the disk).
    if (reader.done()) return std::make_error_code(std::errc::operation_canceled);
    return {};
  });
  if (ec == std::errc::operation_canceled && reader.done()) ec.clear();
  if (!ec || !reader.why().empty()) {
    if (auto e = reader.finish(); e && !ec) ec = e;
  }
  if (ec) {
    why = !reader.why().empty() ? reader.why()
          : ec == std::errc::io_error ? "not a readable .tar.gz (gzip could not decompress it)"
                                      : "could not be unpacked";
    empty_folder(dest);
  }
  return ec;
}

}  // namespace gdskit::doctor
