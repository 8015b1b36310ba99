#include "doctor/system_root.hpp"

#include "posix/bounded_read.hpp"

#include <sys/resource.h>
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

read_result read_limited(const fs::path& p, std::size_t max_bytes, bool tail = false) {
  auto b = read_bounded(p, max_bytes, tail);
  return {std::move(b.text), b.error, b.capped, std::move(b.why)};
}

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

read_result system_root::read(const std::string& rel, std::size_t max_bytes) {
  auto r = read_limited(abs(rel), max_bytes);
  if (r.ok()) recorded_[rel] = *r.text;
  if (r.capped) note_capped(rel);
  return r;
}

read_result system_root::grep(const std::string& rel, const std::vector<std::string>& needles) {
  std::string out;
  auto b = scan_lines_bounded(abs(rel), max_scan_bytes, max_line_bytes, [&](std::string_view line) {
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
  });
  if (!b.ok()) return {std::nullopt, b.error, false, std::move(b.why)};
  if (b.capped) note_capped(rel);
  recorded_[rel] = out;
  return {std::move(out), {}, b.capped, {}};
}

std::vector<std::string> system_root::list(const std::string& rel, std::error_code& ec) {
  std::vector<std::string> names;
  ec.clear();
  fs::directory_iterator it(abs(rel), ec);
  if (ec) return names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool system_root::exists(const std::string& rel) const {
  std::error_code ec;
  return fs::exists(fs::symlink_status(abs(rel), ec));
}

read_result system_root::link_target(const std::string& rel) {
  if (!live_) {
    auto r = read_limited(abs(rel + ".link"), 4096);
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
    auto r = read_limited(abs(rel + "/realpath.txt"), 4096);
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
