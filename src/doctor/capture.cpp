// --capture writes the files the checks read and the command outputs as a tar.gz made by tar(1) from a
// staging folder (no archive library is available on the target machines); --root ARCHIVE reads one back
// into a private folder through gzip and tar_reader, which checks every header before its member is written.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <functional>

#include "tools/programs.hpp"
#include "tools/shell_text.hpp"
#include "doctor/doctor.hpp"
#include "doctor/tar_reader.hpp"
#include "posix/syscalls.hpp"


namespace gdskit::doctor {
namespace fs = std::filesystem;

namespace {

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
  const auto tar_path = tools::find_program("tar");
  if (!tar_path) {
    fd.reset();
    ::unlink(out.c_str());
    why = "tar not found in " + tools::searched_dirs();
    return std::make_error_code(std::errc::no_such_file_or_directory);
  }
  const std::string tar = tar_path->string();
  ec = tools::run_program(*tar_path, {"-czf", "-", "-C", fs::absolute(stage.path()).string(), "."}, -1,
                          tools::stderr_mode::discard, [&](const char* data, std::size_t n) {
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
  const auto gzip = tools::find_program("gzip");
  if (!gzip) {
    why = "gzip not found in " + tools::searched_dirs();
    return std::make_error_code(std::errc::no_such_file_or_directory);
  }
  ec = tools::run_program(*gzip, {"-dc"}, in.get(), tools::stderr_mode::discard,
                          [&](const char* d, std::size_t n) -> std::error_code {
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
