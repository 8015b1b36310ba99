#include "doctor/system_root.hpp"

#include "posix/bounded_read.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace gdskit::doctor {
namespace fs = std::filesystem;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    auto nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string trim(std::string s) {
  auto is_space = [](unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.back())) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}

system_root::system_root(fs::path root, bool live) : root_(std::move(root)), live_(live) {}

fs::path system_root::abs(const std::string& rel) const {
  std::string r = rel;
  while (!r.empty() && r.front() == '/') r.erase(0, 1);
  return root_ / r;
}

namespace {

read_result from_bounded(bounded_text b) { return {std::move(b.text), b.error, b.capped, std::move(b.why)}; }

read_result read_limited(const fs::path& p, std::size_t max_bytes, bool tail = false) {
  return from_bounded(read_bounded(p, max_bytes, tail));
}

// At most this many symbolic links are followed while one path is resolved (the kernel's own limit).
constexpr int max_link_hops = 40;

std::vector<std::string> path_parts(std::string_view p) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < p.size()) {
    auto j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    if (j > i && p.substr(i, j - i) != ".") out.emplace_back(p.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

}  // namespace

posix::unique_fd open_in_root(const fs::path& root, const std::string& rel, int flags, std::error_code& ec,
                              std::string& why) {
  ec.clear();
  why.clear();
  std::vector<posix::unique_fd> dirs;  // dirs[0] is the root, dirs.back() the folder reached so far
  dirs.emplace_back(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dirs.back()) {
    ec = std::error_code(errno, std::generic_category());
    return {};
  }
  std::vector<std::string> todo = path_parts(rel);
  std::reverse(todo.begin(), todo.end());  // a stack: the next component is at the back
  int hops = 0;
  auto refuse = [&](std::string text) {
    ec = std::make_error_code(std::errc::permission_denied);
    why = std::move(text);
    return posix::unique_fd{};
  };
  if (todo.empty()) {
    posix::unique_fd fd(::openat(dirs.back().get(), ".", flags | O_CLOEXEC));
    if (!fd) ec = std::error_code(errno, std::generic_category());
    return fd;
  }
  while (!todo.empty()) {
    const std::string name = std::move(todo.back());
    todo.pop_back();
    if (name == "..") {
      if (dirs.size() == 1) return refuse("a link in the root leads outside it");
      dirs.pop_back();
      continue;
    }
    posix::unique_fd node(::openat(dirs.back().get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!node) {
      ec = std::error_code(errno, std::generic_category());
      return {};
    }
    struct stat st {};
    if (::fstat(node.get(), &st) != 0) {
      ec = std::error_code(errno, std::generic_category());
      return {};
    }
    if (S_ISLNK(st.st_mode)) {
      if (++hops > max_link_hops) {
        ec = std::make_error_code(std::errc::too_many_symbolic_link_levels);
        return {};
      }
      std::string target(4096, '\0');
      const ssize_t n = ::readlinkat(node.get(), "", target.data(), target.size());
      if (n < 0 || static_cast<std::size_t>(n) >= target.size()) {
        ec = n < 0 ? std::error_code(errno, std::generic_category()) : std::make_error_code(std::errc::filename_too_long);
        return {};
      }
      target.resize(static_cast<std::size_t>(n));
      // An absolute link names the machine that holds the capture, never the captured one.
      if (target.empty() || target[0] == '/') return refuse("a link in the root leads outside it");
      auto parts = path_parts(target);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(*it);
      continue;
    }
    if (todo.empty()) {
      // The last component, opened for real; O_NOFOLLOW: a link put there since the check is refused.
      posix::unique_fd fd(::openat(dirs.back().get(), name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) ec = std::error_code(errno, std::generic_category());
      return fd;
    }
    if (!S_ISDIR(st.st_mode)) {
      ec = std::make_error_code(std::errc::not_a_directory);
      return {};
    }
    dirs.push_back(std::move(node));
  }
  // The path ended in ".." or a link to a folder: open the folder reached.
  posix::unique_fd fd(::openat(dirs.back().get(), ".", flags | O_CLOEXEC));
  if (!fd) ec = std::error_code(errno, std::generic_category());
  return fd;
}

namespace {

// Runs a program with its stderr folded into stdout; error when it cannot start or exits non-zero.
read_result run_program(const std::string& cmdline) {
  FILE* p = ::popen((cmdline + " 2>&1").c_str(), "r");
  if (p == nullptr) return {std::nullopt, std::error_code(errno, std::generic_category())};
  std::string out;
  std::array<char, 65536> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0 && out.size() < (8u << 20)) out.append(buf.data(), n);
  int status = ::pclose(p);
  if (status != 0) {
    // Keep what the program said (dmesg explains a restricted buffer) but report the failure.
    return {std::nullopt, std::make_error_code(out.find("not permitted") != std::string::npos
                                                   ? std::errc::operation_not_permitted
                                                   : std::errc::no_such_file_or_directory)};
  }
  return {std::move(out), {}};
}

// The first of `candidates` (absolute paths) that can be run; nullptr when none.
const char* program_path(std::initializer_list<const char*> candidates) {
  for (const char* p : candidates)
    if (::access(p, X_OK) == 0) return p;
  return nullptr;
}

bool program_exists(const char* name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/bin:/bin:/usr/sbin:/sbin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && ::access((fs::path(dir) / name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

void system_root::note_capped(const std::string& rel) {
  if (std::find(capped_.begin(), capped_.end(), rel) == capped_.end()) capped_.push_back(rel);
}

posix::unique_fd system_root::open_file(const std::string& rel, read_result& failed) const {
  std::error_code ec;
  std::string why;
  posix::unique_fd fd = open_in_root(root_, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, ec, why);
  if (!fd) failed = {std::nullopt, ec, false, std::move(why)};
  return fd;
}

read_result system_root::read(const std::string& rel, std::size_t max_bytes) {
  read_result r;
  if (live_) {
    r = read_limited(abs(rel), max_bytes);
  } else if (posix::unique_fd fd = open_file(rel, r)) {
    r = from_bounded(read_bounded(std::move(fd), max_bytes));
  }
  if (r.ok()) recorded_[rel] = *r.text;
  if (r.capped) note_capped(rel);
  return r;
}

read_result system_root::grep(const std::string& rel, const std::vector<std::string>& needles) {
  std::string out;
  auto on_line = [&](std::string_view line) {
    for (const auto& n : needles) {
      if (line.find(n) != std::string_view::npos) {
        // Matching lines are few (symbols of a handful of modules); a file of nothing but matches is capped too.
        if (out.size() < (8u << 20)) {
          out += line;
          out += '\n';
        }
        break;
      }
    }
  };
  bounded_text b;
  if (live_) {
    b = scan_lines_bounded(abs(rel), max_scan_bytes, max_line_bytes, on_line);
  } else {
    read_result failed;
    posix::unique_fd fd = open_file(rel, failed);
    if (!fd) return failed;
    b = scan_lines_bounded(std::move(fd), max_scan_bytes, max_line_bytes, on_line);
  }
  if (!b.ok()) return {std::nullopt, b.error, false, std::move(b.why)};
  if (b.capped) note_capped(rel);
  recorded_[rel] = out;
  return {std::move(out), {}, b.capped, {}};
}

std::vector<std::string> system_root::list(const std::string& rel, std::error_code& ec, bool record_links) {
  std::vector<std::string> names;
  ec.clear();
  // Folders of links (sysfs slaves and holders) are kept in a capture as one X.link file per entry.
  constexpr std::size_t max_recorded_links = 4096;
  std::size_t recorded_links = 0;
  if (!live_) {
    std::string why;
    posix::unique_fd fd = open_in_root(root_, rel, O_RDONLY | O_DIRECTORY, ec, why);
    if (!fd) return names;
    DIR* d = ::fdopendir(fd.get());
    if (d == nullptr) {
      ec = std::error_code(errno, std::generic_category());
      return names;
    }
    fd.release();  // closedir closes it
    // A folder of a hostile root can hold millions of entries: the checks never need more than these.
    constexpr std::size_t max_entries = 100000;
    std::vector<std::string> links;
    while (const dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      if (names.size() >= max_entries) break;
      // "X.link" stands for the link X of the captured machine.
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".link") == 0) {
        links.push_back(n);
        n.resize(n.size() - 5);
      }
      names.push_back(std::move(n));
    }
    ::closedir(d);
    if (record_links) {
      for (const auto& l : links) {
        if (++recorded_links > max_recorded_links) break;
        (void)read(rel + "/" + l, 4096);
      }
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }
  fs::directory_iterator it(abs(rel), ec);
  if (ec) return names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    names.push_back(it->path().filename().string());
    if (record_links && it->is_symlink() && ++recorded_links <= max_recorded_links) {
      std::error_code lec;
      const auto target = fs::read_symlink(it->path(), lec);
      if (!lec) recorded_[rel + "/" + names.back() + ".link"] = target.string() + "\n";
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool system_root::exists(const std::string& rel) const {
  std::error_code ec;
  if (!live_) {
    std::string why;
    return static_cast<bool>(open_in_root(root_, rel, O_PATH, ec, why)) ||
           static_cast<bool>(open_in_root(root_, rel + ".link", O_PATH, ec, why));
  }
  return fs::exists(fs::symlink_status(abs(rel), ec));
}

read_result system_root::link_target(const std::string& rel) {
  if (!live_) {
    auto r = read(rel + ".link", 4096);
    if (r.ok()) {
      *r.text = trim(*r.text);
      recorded_[rel + ".link"] = *r.text + "\n";
    }
    return r;
  }
  std::error_code ec;
  auto target = fs::read_symlink(abs(rel), ec);
  if (ec) return {std::nullopt, ec};
  recorded_[rel + ".link"] = target.string() + "\n";
  return {target.string(), {}};
}

read_result system_root::real_path(const std::string& rel) {
  if (!live_) {
    auto r = read(rel + "/realpath.txt", 4096);
    if (r.ok()) {
      *r.text = trim(*r.text);
      recorded_[rel + "/realpath.txt"] = *r.text + "\n";
    }
    return r;
  }
  std::error_code ec;
  auto p = fs::canonical(abs(rel), ec);
  if (ec) return {std::nullopt, ec};
  recorded_[rel + "/realpath.txt"] = p.string() + "\n";
  return {p.string(), {}};
}

read_result system_root::command(const std::string& name) {
  const std::string rel = "commands/" + name + ".txt";
  if (!live_) return read(rel, 8u << 20);
  auto r = live_command(name);
  if (r.ok()) recorded_[rel] = *r.text;
  return r;
}

read_result system_root::live_command(const std::string& name) {
  std::error_code ec;
  if (name == "dmesg") {
    if (!program_exists("dmesg")) return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory)};
    return run_program("dmesg");
  }
  if (name == "nvidia-smi-q") {
    if (!program_exists("nvidia-smi")) return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory)};
    auto r = run_program("nvidia-smi -q");
    if (r.ok()) {
      // Serial numbers identify hardware and are not needed by any check.
      std::string kept;
      for (auto& l : split_lines(*r.text)) {
        if (l.find("Serial Number") == std::string::npos) kept += l + "\n";
      }
      r.text = std::move(kept);
    }
    return r;
  }
  if (name == "uname") {
    struct utsname u {};
    if (::uname(&u) != 0) return {std::nullopt, std::error_code(errno, std::generic_category())};
    return {std::string(u.sysname) + " host " + u.release + " " + u.version + " " + u.machine + "\n", {}};
  }
  if (name == "ulimit-l") {
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return {std::nullopt, std::error_code(errno, std::generic_category())};
    if (rl.rlim_cur == RLIM_INFINITY) return {std::string("unlimited\n"), {}};
    return {std::to_string(rl.rlim_cur / 1024) + "\n", {}};
  }
  if (name == "iommu_groups" || name == "run-udev-data") {
    const char* dir = name == "iommu_groups" ? "/sys/kernel/iommu_groups" : "/run/udev/data";
    auto names = list(dir, ec);
    if (ec) {
      return {std::string("ls: cannot access '") + dir + "': " + ec.message() + "\n", {}};
    }
    std::string out;
    for (auto& n : names) out += n + "\n";
    return {std::move(out), {}};
  }
  if (name == "dev-nvidia-fs") {
    auto names = list("dev", ec);
    if (ec) return {std::nullopt, ec};
    std::string out;
    for (auto& n : names)
      if (n.rfind("nvidia-fs", 0) == 0) out += n + "\n";
    return {std::move(out), {}};
  }
  if (name == "modinfo-nvidia-fs" || name == "modinfo-nvidia") {
    const char* prog = program_path({"/sbin/modinfo", "/usr/sbin/modinfo", "/usr/bin/modinfo"});
    if (prog == nullptr) return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory)};
    return run_program(std::string(prog) + (name == "modinfo-nvidia" ? " nvidia" : " nvidia-fs"));
  }
  if (name == "dkms-status") {
    const char* prog = program_path({"/usr/sbin/dkms", "/sbin/dkms", "/usr/bin/dkms"});
    if (prog == nullptr) return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory)};
    return run_program(std::string(prog) + " status");
  }
  if (name == "mokutil-sb-state") {
    const char* prog = program_path({"/usr/bin/mokutil", "/bin/mokutil", "/usr/sbin/mokutil"});
    if (prog == nullptr) return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory)};
    return run_program(std::string(prog) + " --sb-state");
  }
  if (name == "ls-sys-bus-pci-devices") {
    auto names = list("sys/bus/pci/devices", ec);
    if (ec) return {std::nullopt, ec};
    std::string out;
    for (auto& n : names) {
      std::error_code lec;
      auto t = fs::read_symlink(abs("sys/bus/pci/devices/" + n), lec);
      out += n + " -> " + (lec ? std::string("?") : t.string()) + "\n";
    }
    return {std::move(out), {}};
  }
  if (name == "cufile-log") {
    const char* env = std::getenv("CUFILE_LOGFILE_PATH");
    fs::path p = env != nullptr && *env != '\0' ? fs::path(env) : fs::current_path(ec) / "cufile.log";
    // Only the tail matters: the latest run's lines.
    return read_limited(p, 256 * 1024, /*tail=*/true);
  }
  return {std::nullopt, std::make_error_code(std::errc::invalid_argument)};
}

}  // namespace gdskit::doctor
