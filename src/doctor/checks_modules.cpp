// Kernel modules: why one that GDS needs is not loaded, and nvidia-fs's own account of its health (its
// statistics and releases with reported regressions).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "doctor/checks.hpp"

namespace gdskit::doctor {
namespace {

// The file name a module is installed under ("nvidia_fs" is nvidia-fs.ko).
std::string file_stem(const std::string& module) { return module == "nvidia_fs" ? "nvidia-fs" : module; }

// "key=value" tokens of a line ("Reads : n=3 ok=3 err=0 readMiB=1"), numbers only.
std::vector<std::pair<std::string, std::uint64_t>> counters_in(std::string_view line) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    const std::string_view tok = line.substr(i, j - i);
    const auto eq = tok.find('=');
    if (eq != std::string_view::npos && eq > 0) {
      std::uint64_t v = 0;
      const auto val = tok.substr(eq + 1);
      auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
      if (ec == std::errc() && p == val.data() + val.size()) out.emplace_back(std::string(tok.substr(0, eq)), v);
    }
    i = j;
  }
  return out;
}

// Whether Secure Boot, kernel lockdown or enforced module signatures refuse unsigned modules; the evidence.
struct signing_state {
  bool enforced = false;
  std::vector<source_ref> evidence;
};

signing_state module_signing(system_root& root) {
  signing_state s;
  // The EFI variable: 4 bytes of attributes, then 1 when Secure Boot is on.
  const std::string sb = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";
  if (auto r = root.read(sb, 64); r.ok() && r.text->size() >= 5) {
    const bool on = (*r.text)[4] == 1;
    s.enforced |= on;
    s.evidence.push_back({sb, 0, on ? "Secure Boot enabled" : "Secure Boot disabled"});
  }
  if (auto r = root.read("sys/kernel/security/lockdown", 256); r.ok()) {
    const std::string t = trim(*r.text);
    const bool on = t.find("[none]") == std::string::npos && t.find('[') != std::string::npos;
    s.enforced |= on;
    s.evidence.push_back({"sys/kernel/security/lockdown", 1, t});
  }
  if (auto r = root.read("sys/module/module/parameters/sig_enforce", 16); r.ok()) {
    const bool on = trim(*r.text) == "Y";
    s.enforced |= on;
    s.evidence.push_back({"sys/module/module/parameters/sig_enforce", 1, trim(*r.text)});
  }
  if (auto r = root.command("mokutil-sb-state"); r.ok()) {
    auto [line, text] = last_line_with(*r.text, "SecureBoot");
    if (line > 0) {
      s.enforced |= text.find("enabled") != std::string::npos;
      s.evidence.push_back({"commands/mokutil-sb-state.txt", line, text});
    }
  }
  return s;
}

// A "field: value" of modinfo output.
std::string modinfo_field(const std::string& text, const std::string& key) {
  for (const auto& l : split_lines(text)) {
    if (l.rfind(key + ":", 0) == 0) return trim(l.substr(key.size() + 1));
  }
  return {};
}

// Known nvidia-fs releases that users reported broken, with what happens and what to do.
struct bad_release {
  dotted_version version;
  const char* what;
  const char* fix;
};
const bad_release bad_releases[] = {
    {{2, 25, 6},
     "nvidia-fs 2.25.6 broke DMA mapping: reads through nvidia-fs fail where 2.24.3 works (reported upstream, "
     "NVIDIA/gds-nvidia-fs issue 60)",
     "Install another nvidia-fs release (the reporter went back to 2.24.3; later releases changed the DMA entry "
     "cache again), then reload nvidia-fs."},
};

}  // namespace

std::optional<dotted_version> parse_dotted_version(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9')) continue;
    int parts[3] = {0, 0, 0};
    std::size_t pos = i;
    int n = 0;
    for (; n < 3; ++n) {
      int v = 0;
      auto [p, ec] = std::from_chars(s.data() + pos, s.data() + s.size(), v);
      if (ec != std::errc() || p == s.data() + pos) break;
      parts[n] = v;
      pos = static_cast<std::size_t>(p - s.data());
      if (n < 2 && pos + 1 < s.size() && s[pos] == '.' && s[pos + 1] >= '0' && s[pos + 1] <= '9') {
        ++pos;
      } else {
        ++n;
        break;
      }
    }
    if (n >= 2) return dotted_version{parts[0], parts[1], parts[2]};
    i = pos;
  }
  return std::nullopt;
}

std::string version_text(const dotted_version& v, bool with_patch) {
  return with_patch ? fmt::format("{}.{}.{}", v.major, v.minor, v.patch) : fmt::format("{}.{}", v.major, v.minor);
}

std::pair<int, std::string> last_line_with(const std::string& text, std::string_view needle) {
  const auto lines = split_lines(text);
  for (std::size_t i = lines.size(); i-- > 0;) {
    if (lines[i].find(needle) != std::string::npos) return {static_cast<int>(i + 1), trim(lines[i])};
  }
  return {0, {}};
}

load_failure why_not_loaded(system_root& root, const facts& f, const std::string& module) {
  load_failure out;
  const std::string stem = file_stem(module);
  const std::string prefix = module + ": ";
  auto log_line = [&](std::string_view what) -> std::pair<int, std::string> {
    if (!f.dmesg_readable) return {0, {}};
    const auto lines = split_lines(f.dmesg);
    for (std::size_t i = lines.size(); i-- > 0;) {
      if (lines[i].find(prefix) != std::string::npos && lines[i].find(what) != std::string::npos)
        return {static_cast<int>(i + 1), trim(lines[i])};
    }
    return {0, {}};
  };
  auto cite = [&](const std::pair<int, std::string>& l) { out.evidence.push_back({"commands/dmesg.txt", l.first, l.second}); };

  // 1. The kernel said why when it refused the module.
  if (auto l = log_line("GPL-only symbols"); l.first > 0 && module == "nvidia_fs") {
    cite(l);
    out.cause = "the proprietary nvidia.ko does not give GPL modules its nvidia_p2p_* symbols, so the kernel refused "
                "nvidia-fs";
    out.fix = "Install the NVIDIA open kernel module (nvidia-driver-<ver>-open, or the .run installer with "
              "-m=kernel-open): nvidia-fs 2.17.5 and later work only with it. Then modprobe nvidia-fs.";
    return out;
  }
  if (auto l = log_line("version magic"); l.first > 0) {
    cite(l);
    out.cause = fmt::format("the installed {}.ko was built for another kernel (version magic){}", stem,
                            f.release.empty() ? "" : "; running " + f.release);
    out.fix = fmt::format("Rebuild it for the running kernel (dkms autoinstall, or reinstall the {} package with the "
                          "headers of {} present), or boot the kernel it was built for.",
                          stem, f.release.empty() ? std::string("this kernel") : f.release);
    return out;
  }
  if (auto l = log_line("disagrees about version of symbol"); l.first > 0) {
    cite(l);
    out.cause = fmt::format("{}.ko was built against another build of the kernel or of nvidia.ko (symbol versions "
                            "differ)", stem);
    out.fix = fmt::format("Rebuild {} against the running kernel and the loaded NVIDIA driver (dkms autoinstall).", stem);
    return out;
  }
  const signing_state sig = module_signing(root);
  {
    auto [line, text] = f.dmesg_readable ? last_line_with(f.dmesg, "Loading of unsigned module is rejected")
                                         : std::pair<int, std::string>{0, {}};
    if (line == 0 && f.dmesg_readable) std::tie(line, text) = last_line_with(f.dmesg, "unsigned module loading is restricted");
    if (line > 0) {
      out.evidence.push_back({"commands/dmesg.txt", line, text});
      for (const auto& e : sig.evidence) out.evidence.push_back(e);
      out.cause = "Secure Boot / kernel lockdown refuses unsigned modules, and " + stem + ".ko is not signed with a key "
                  "the kernel trusts";
      out.fix = "Sign " + stem + ".ko with the DKMS MOK key and enroll it (mokutil --import /var/lib/dkms/mok.pub, reboot, "
                "confirm in the MOK manager), or disable Secure Boot in the firmware setup.";
      return out;
    }
  }
  if (auto l = log_line("Unknown symbol"); l.first > 0) {
    cite(l);
    out.cause = fmt::format("{}.ko needs symbols the running kernel or drivers do not provide", stem);
    out.fix = fmt::format("Rebuild {} for the running kernel and driver (dkms autoinstall), and load nvidia.ko first.", stem);
    return out;
  }

  // 2. Installed for the running kernel at all?
  std::optional<bool> installed;
  if (!f.release.empty()) {
    const std::string dep = "lib/modules/" + f.release + "/modules.dep";
    auto r = root.grep(dep, {"/" + stem + ".ko", "/" + module + ".ko"});
    if (r.ok()) {
      // A line "path/nvidia-fs.ko[.zst]: deps"; the name must end the path part.
      for (const auto& l : split_lines(*r.text)) {
        const std::string path = l.substr(0, l.find(':'));
        const auto slash = path.rfind('/');
        const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
        if (name.rfind(stem + ".ko", 0) == 0 || name.rfind(module + ".ko", 0) == 0) {
          installed = true;
          out.evidence.push_back({dep, 0, trim(l)});
          break;
        }
      }
      if (!installed) {
        installed = false;
        out.evidence.push_back({dep, 0, "no " + stem + ".ko"});
      }
    }
  }
  const auto modinfo = root.command("modinfo-" + stem);
  if (installed && !*installed) {
    out.cause = fmt::format("no {}.ko is installed for the running kernel {}", stem, f.release);
    if (auto dkms = root.command("dkms-status"); dkms.ok()) {
      std::vector<std::string> built;
      int first = 0;
      const auto lines = split_lines(*dkms.text);
      for (std::size_t i = 0; i < lines.size(); ++i) {
        const std::string l = trim(lines[i]);
        if (l.rfind(stem + "/", 0) != 0 && l.rfind(stem + ",", 0) != 0) continue;
        if (first == 0) first = static_cast<int>(i + 1);
        built.push_back(l);
      }
      if (!built.empty()) {
        out.evidence.push_back({"commands/dkms-status.txt", first, built.front()});
        const bool for_running = std::any_of(built.begin(), built.end(), [&](const std::string& l) {
          return l.find(", " + f.release + ",") != std::string::npos || l.find(", " + f.release + ":") != std::string::npos;
        });
        if (!for_running) out.cause += ": DKMS has it, but did not build it for this kernel (a failed build)";
      }
    }
    // The DKMS build log says why the build failed.
    std::error_code ec;
    // A handful of versions is what DKMS keeps; a hostile root's thousands are not each opened.
    auto versions = root.list("var/lib/dkms/" + stem, ec);
    if (versions.size() > 8) versions.resize(8);
    for (const auto& ver : versions) {
      const std::string log = "var/lib/dkms/" + stem + "/" + ver + "/build/make.log";
      auto r = root.grep(log, {"error:", "Error "});
      if (r.ok() && !r.text->empty()) {
        out.evidence.push_back({log, 0, trim(split_lines(*r.text).front())});
        break;
      }
    }
    out.fix = fmt::format("Install the kernel headers for {} and rebuild (dkms autoinstall -k {}); if the build fails, "
                          "use an {} release that supports this kernel, or boot a kernel it builds for.",
                          f.release, f.release, stem);
    return out;
  }

  // 3. Installed but refused: Secure Boot without a trusted signature, or built for another kernel.
  const std::string signer = modinfo.ok() ? modinfo_field(*modinfo.text, "signer") : std::string();
  const std::string vermagic = modinfo.ok() ? modinfo_field(*modinfo.text, "vermagic") : std::string();
  if (modinfo.ok() && !vermagic.empty() && !f.release.empty() && vermagic.substr(0, vermagic.find(' ')) != f.release) {
    out.evidence.push_back({"commands/modinfo-" + stem + ".txt", 0, "vermagic: " + vermagic});
    out.cause = fmt::format("{}.ko was built for kernel {} but {} is running (version magic)", stem,
                            vermagic.substr(0, vermagic.find(' ')), f.release);
    out.fix = fmt::format("Rebuild {} for {} (dkms autoinstall), or boot the kernel it was built for.", stem, f.release);
    return out;
  }
  if (sig.enforced && (!modinfo.ok() || signer.empty())) {
    for (const auto& e : sig.evidence) out.evidence.push_back(e);
    if (modinfo.ok()) out.evidence.push_back({"commands/modinfo-" + stem + ".txt", 0, "no signer: the module is not signed"});
    out.cause = fmt::format("Secure Boot / lockdown refuses unsigned modules, and {}.ko {}", stem,
                            modinfo.ok() ? "is not signed" : "may not be signed (modinfo not recorded)");
    out.fix = "Sign " + stem + ".ko with the DKMS MOK key and enroll it (mokutil --import /var/lib/dkms/mok.pub, reboot, "
              "confirm in the MOK manager), or disable Secure Boot in the firmware setup.";
    return out;
  }
  if (installed && *installed) out.fix = fmt::format("modprobe {}; if it fails, its reason is in dmesg.", module);
  return out;
}

void check_nvfs_health(system_root& root, facts& f, layer& kernel) {
  const std::string rel = "proc/driver/nvidia-fs/stats";
  auto r = root.read(rel);
  // Where the version comes from: the statistics' full version, else the version file's major.minor.
  source_ref version_line{"proc/driver/nvidia-fs/version", 1, ""};
  if (auto v = root.read("proc/driver/nvidia-fs/version", 4096); v.ok()) version_line.text = trim(*v.text);
  {
    check c{"kernel.nvfs_stats", "nvidia-fs statistics", status::unknown, impact::none, "", {}, ""};
    if (!r.ok()) {
      // Absent from a capture made before the doctor read it: nothing to report. Present but unreadable: say so.
      if (r.error != std::errc::no_such_file_or_directory) {
        c.summary = "proc/driver/nvidia-fs/stats not readable: " + r.reason();
        kernel.checks.push_back(std::move(c));
      }
    } else {
      struct counted {
        std::string what;
        std::uint64_t n;
        int line;
        std::string text;
      };
      std::vector<counted> errors;
      std::uint64_t read_ok = 0, pin_ok = 0;
      const auto lines = split_lines(*r.text);
      for (std::size_t i = 0; i < lines.size(); ++i) {
        const std::string& l = lines[i];
        if (auto v = l.find("NVFS Driver(version:"); v != std::string::npos) {
          if (auto ver = parse_dotted_version(std::string_view(l).substr(v))) {
            f.route.nvfs_version = ver;
            f.route.nvfs_version_exact = true;
            version_line = {rel, static_cast<int>(i + 1), trim(l)};
          }
        }
        const auto colon = l.find(':');
        if (colon == std::string::npos) continue;
        const std::string key = trim(l.substr(0, colon));
        for (const auto& [name, v] : counters_in(std::string_view(l).substr(colon + 1))) {
          if (key == "Reads" && name == "ok") read_ok = v;
          if (key == "Bar1-map" && name == "ok") pin_ok = v;
          if (v == 0) continue;
          std::string what;
          if (key == "Reads" && (name == "err" || name == "io_state_err")) what = "reads failed";
          else if (key == "Writes" && (name == "err" || name == "io_state_err" || name == "pg-cache-fail" || name == "pg-cache-eio"))
            what = "writes failed";
          else if (key == "Bar1-map" && name == "err") what = "GPU memory could not be pinned (nvidia_p2p_get_pages refused)";
          else if (key == "Mmap" && name == "err") what = "buffer set-up (mmap) failed";
          else if (key == "Batches" && name == "err") what = "batch IO failed";
          else if (key == "Error" && name == "dma-map") what = "DMA mapping failed";
          else if (key == "Error" && name == "sg-ext") what = "scatter lists could not be extended";
          else if (key == "Error" && name == "cpu-gpu-pages") what = "requests mixed CPU and GPU pages";
          else if (key == "Error" && name == "dma-ref") what = "DMA references went wrong";
          if (!what.empty()) errors.push_back({fmt::format("{} ({} {}={})", what, key, name, v), v, static_cast<int>(i + 1), trim(l)});
        }
      }
      if (errors.empty()) {
        c.state = status::ok;
        c.summary = fmt::format("no error counted since nvidia-fs was loaded (reads ok {}, GPU pins ok {})", read_ok, pin_ok);
      } else {
        // Errors beside successes limit GDS; errors alone mean the direct path has not worked here.
        c.state = read_ok > 0 || pin_ok > 0 ? status::warn : status::fail;
        c.blocks = impact::direct;
        std::vector<std::string> whats;
        for (const auto& e : errors) {
          whats.push_back(e.what);
          c.evidence.push_back({rel, e.line, e.text});
        }
        c.summary = fmt::format("nvidia-fs counted errors: {}", fmt::join(whats, "; "));
        c.fix = "See the nvidia-fs lines of dmesg for each failure (logs layer); a pin failure is the NVIDIA driver "
                "refusing P2P (GeForce, BAR1 full), DMA mapping failures point at the IOMMU or a driver mismatch. "
                "Counters reset with: echo 1 > /proc/driver/nvidia-fs/stats.";
      }
      kernel.checks.push_back(std::move(c));
    }
  }
  if (f.route.nvfs_version) {
    const dotted_version v = *f.route.nvfs_version;
    check c{"kernel.nvfs_release", "nvidia-fs release", status::ok, impact::direct, "", {}, ""};
    c.evidence.push_back(version_line);
    const bool known_patch = f.route.nvfs_version_exact;
    c.summary = fmt::format("nvidia-fs {}: no regression reported for it", version_text(v, known_patch));
    for (const auto& b : bad_releases) {
      // A version file gives only major.minor: a reported release is then possible, not known.
      const bool exact = known_patch && v == b.version;
      const bool maybe = !known_patch && v.major == b.version.major && v.minor == b.version.minor;
      if (exact || maybe) {
        c.state = exact ? status::fail : status::warn;
        c.summary = exact ? b.what : fmt::format("nvidia-fs {}.{} (patch level unknown); if it is {}.{}.{}: {}", v.major,
                                                 v.minor, b.version.major, b.version.minor, b.version.patch, b.what);
        c.fix = b.fix;
      }
    }
    if (v < dotted_version{2, 12, 0}) {
      c.state = status::fail;
      c.summary = fmt::format("nvidia-fs {}.{} is older than 2.12, the oldest libcufile accepts", v.major, v.minor);
      c.fix = "Install a current nvidia-fs (nvidia-fs-dkms from the CUDA repository).";
    }
    kernel.checks.push_back(std::move(c));
  }
}

}  // namespace gdskit::doctor
