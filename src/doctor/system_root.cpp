#include "doctor/system_root.hpp"

#include "posix/bounded_read.hpp"
#include "tools/programs.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

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

system_root::system_root(fs::path root, bool live) : root_(std::move(root)), live_(live), files_(root_, live) {}

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

// A program's output, or why there is none: a program that fails gives EPERM when it said "not permitted"
// (dmesg with a restricted buffer), else ENOENT, as if it had not been there.
read_result run_program(const fs::path& program, const std::vector<std::string>& args) {
  auto out = tools::run_captured(program, args, 8u << 20);
  if (out.error == std::errc::io_error) {
    return {std::nullopt, std::make_error_code(out.text.find("not permitted") != std::string::npos
                                                   ? std::errc::operation_not_permitted
                                                   : std::errc::no_such_file_or_directory)};
  }
  if (out.error) return {std::nullopt, out.error};
  return {std::move(out.text), {}, out.capped, {}};
}

}  // namespace

void system_root::note_capped(const std::string& rel) {
  if (std::find(capped_.begin(), capped_.end(), rel) == capped_.end()) capped_.push_back(rel);
}

read_result system_root::read(const std::string& rel, std::size_t max_bytes) {
  read_result r = from_bounded(files_.read(rel, max_bytes));
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
  bounded_text b = files_.scan_lines(rel, max_scan_bytes, max_line_bytes, on_line);
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
    // A folder of a hostile root can hold millions of entries: the checks never need more than these.
    std::vector<std::string> links;
    for (std::string& n : files_.list(rel, ec, 100000)) {
      // "X.link" stands for the link X of the captured machine.
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".link") == 0) {
        links.push_back(n);
        n.resize(n.size() - 5);
      }
      names.push_back(std::move(n));
    }
    if (ec) return names;
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
    return static_cast<bool>(posix::open_in_root(root_, rel, O_PATH, ec, why)) ||
           static_cast<bool>(posix::open_in_root(root_, rel + ".link", O_PATH, ec, why));
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
  if (r.capped) note_capped(rel);
  return r;
}

read_result system_root::run_found(const char* program, const std::vector<std::string>& args) {
  // nvidia-smi also lives in the driver's own folders (containers, WSL); everything else in the system's.
  const bool nvidia = std::string_view(program) == "nvidia-smi";
  const std::span<const char* const> extra = nvidia ? std::span<const char* const>(tools::nvidia_program_dirs)
                                                    : std::span<const char* const>();
  const auto path = tools::find_program(program, extra);
  if (!path) {
    const std::string where = tools::searched_dirs(extra);
    if (std::none_of(not_found_.begin(), not_found_.end(), [&](const missing_program& m) { return m.name == program; }))
      not_found_.push_back({program, where});
    return {std::nullopt, std::make_error_code(std::errc::no_such_file_or_directory), false,
            std::string(program) + " not found in " + where};
  }
  return run_program(*path, args);
}

read_result system_root::live_command(const std::string& name) {
  std::error_code ec;
  if (name == "dmesg") return run_found("dmesg", {});
  if (name == "nvidia-smi-q") {
    auto r = run_found("nvidia-smi", {"-q"});
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
    return run_found("modinfo", {name == "modinfo-nvidia" ? "nvidia" : "nvidia-fs"});
  }
  if (name == "dkms-status") return run_found("dkms", {"status"});
  if (name == "mokutil-sb-state") return run_found("mokutil", {"--sb-state"});
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
