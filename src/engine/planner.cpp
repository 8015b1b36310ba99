#include "engine/planner.hpp"

#include <sys/sysmacros.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "posix/bounded_read.hpp"

namespace gdskit::engine {
namespace {

bool path_exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

// Which of `symbols` /proc/kallsyms (or a captured copy) names, as a bit per symbol. Bounded like the doctor's
// scan: a device or FIFO in a captured root is not read, an endless file stops at the limit.
unsigned kallsyms_has(const std::filesystem::path& p, std::initializer_list<const char*> symbols) {
  unsigned found = 0;
  (void)scan_lines_bounded(p, 256u << 20, 4096, [&](std::string_view line) {
    unsigned bit = 1;
    for (const char* s : symbols) {
      // kallsyms lines end with the symbol name, optionally followed by "\t[module]".
      const std::string_view sym(s);
      auto pos = line.find(sym);
      const auto end = pos + sym.size();
      if (pos != std::string_view::npos && (pos == 0 || line[pos - 1] == ' ' || line[pos - 1] == '\t') &&
          (end == line.size() || line[end] == '\t' || line[end] == ' '))
        found |= bit;
      bit <<= 1;
    }
  });
  return found;
}

// The live system's kallsyms holds a few hundred thousand lines (tens of milliseconds to scan), and every file
// opened for a GPU read asks; the answer only changes when the NVMe module is swapped, so it is kept a while.
// Bit 0: the NVMe nvfs hook (either version); bit 1: PCI P2PDMA in the kernel.
unsigned kernel_symbols(const std::filesystem::path& root) {
  auto scan = [](const std::filesystem::path& p) {
    const unsigned bits =
        kallsyms_has(p, {"nvme_v1_register_nvfs_dma_ops", "nvme_v2_register_nvfs_dma_ops", "p2pdma_pgmap_ops"});
    return ((bits & 3u) != 0 ? 1u : 0u) | ((bits & 4u) != 0 ? 2u : 0u);
  };
  if (root != "/") return scan(root / "proc/kallsyms");
  static std::mutex mutex;
  static std::optional<unsigned> cached;
  static std::chrono::steady_clock::time_point when;
  std::lock_guard lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (!cached || now - when > std::chrono::seconds(30)) {
    cached = scan("/proc/kallsyms");
    when = now;
  }
  return *cached;
}

bool cufile_json_requests_p2pdma(const std::filesystem::path& root) {
  if (const char* env = std::getenv("CUFILE_USE_PCIP2PDMA"); env != nullptr && root == "/") {
    return std::string_view(env) == "true" || std::string_view(env) == "1";
  }
  std::filesystem::path json = root / "etc/cufile.json";
  if (const char* env = std::getenv("CUFILE_ENV_PATH_JSON"); env != nullptr && root == "/") json = env;
  auto text = read_bounded(json, 1 << 20);
  if (!text.ok()) return false;
  auto j = nlohmann::json::parse(*text.text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (!j.is_object()) return false;
  auto props = j.find("properties");
  if (props != j.end() && props->is_object()) {
    auto v = props->find("use_pci_p2pdma");
    if (v != props->end() && v->is_boolean()) return v->get<bool>();
  }
  return false;
}

std::string read_line(const std::filesystem::path& p) {
  std::string text = read_bounded(p, 64 * 1024).text.value_or("");
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

// The whole-disk name of the block device holding `dev`. A live sysfs resolves /sys/dev/block/M:m (partitions
// to their parent); a captured root may only have /sys/block/<disk>[/<part>]/dev, which is searched instead.
std::string block_device_of(const std::filesystem::path& root, dev_t dev) {
  if (major(dev) == 0) return {};  // tmpfs, overlay and other virtual file systems
  const std::string want = fmt::format("{}:{}", major(dev), minor(dev));
  std::error_code ec;
  std::filesystem::path target = std::filesystem::canonical(root / "sys/dev/block" / want, ec);
  if (!ec) {
    if (path_exists(target / "partition")) target = target.parent_path();
    return target.filename().string();
  }
  for (const auto& disk : std::filesystem::directory_iterator(root / "sys/block", ec)) {
    if (read_line(disk.path() / "dev") == want) return disk.path().filename().string();
    std::error_code ec2;
    for (const auto& part : std::filesystem::directory_iterator(disk.path(), ec2)) {
      if (part.is_directory(ec2) && read_line(part.path() / "dev") == want) return disk.path().filename().string();
    }
  }
  return {};
}

}  // namespace

system_facts gather_facts(const std::filesystem::path& root, dev_t dev, const std::string& fs_type) {
  system_facts f;
  f.fs_type = fs_type;
  if (auto ver = read_bounded(root / "proc/driver/nvidia-fs/version", 64 * 1024); ver.ok()) {
    f.nvidia_fs_loaded = true;
    f.nvidia_fs_version = ver.text->substr(0, ver.text->find('\n'));
  }
  const std::string nv = read_line(root / "proc/driver/nvidia/version");
  f.p2pdma.open_module = nv.find("Open Kernel Module") != std::string::npos;
  if (auto v = driver_version_in(nv)) f.p2pdma.driver_major = v->major;
  // "RegistryDwords: "..."" in the driver's parameter list.
  const std::string params = read_bounded(root / "proc/driver/nvidia/params", 1 << 20).text.value_or("");
  for (std::size_t pos = 0; pos < params.size();) {
    auto nl = params.find('\n', pos);
    if (nl == std::string::npos) nl = params.size();
    const std::string_view line(params.data() + pos, nl - pos);
    if (line.rfind("RegistryDwords:", 0) == 0) f.p2pdma.static_bar1 = registry_sets_static_bar1(line.substr(15));
    pos = nl + 1;
  }
  f.p2pdma.use_pci_p2pdma = cufile_json_requests_p2pdma(root);
  std::error_code ec;
  f.run_udev = std::filesystem::is_directory(root / "run/udev", ec);
  if (major(dev) != 0) f.udev_entry = path_exists(root / fmt::format("run/udev/data/b{}:{}", major(dev), minor(dev)));
  f.block_device = block_device_of(root, dev);
  f.on_nvme = f.block_device.rfind("nvme", 0) == 0;
  // Reading kallsyms costs the first GPU transfer of a process tens of milliseconds (150k lines on the H200
  // machine); its two symbols matter only when the rest of a route is there.
  f.p2pdma.kernel_known =
      f.on_nvme && (f.nvidia_fs_loaded || p2pdma_missing_outside_kernel(f.p2pdma).empty());
  if (f.kernel_symbols_checked()) {
    const unsigned syms = kernel_symbols(root);
    f.nvme_nvfs_hook = (syms & 1u) != 0;
    f.p2pdma.kernel_p2pdma = (syms & 2u) != 0;
  }
  return f;
}

path_decision decide(const system_facts& sys, const runtime_facts& rt, memory_kind kind, path_mode mode) {
  path_decision d;
  if (kind == memory_kind::host || kind == memory_kind::pinned) {
    d.path = data_path::host;
    d.reasons.push_back(fmt::format("buffer is {} memory", to_string(kind)));
    if (!rt.direct_ok) d.reasons.push_back(rt.direct_reason);
    return d;
  }
  // Why GDS (a direct DMA path) is or is not available, in the order a user should fix them.
  std::vector<std::string> why_not;
  if (!rt.gpu_ok) why_not.push_back("no usable GPU: " + rt.gpu_reason);
  if (!rt.cufile_ok) why_not.push_back(rt.cufile_reason);
  if (kind == memory_kind::managed) why_not.push_back("managed memory: cuFile refuses it (5013)");
  if (sys.fs_type == "tmpfs" || sys.fs_type == "ramfs" || sys.fs_type == "overlayfs") {
    why_not.push_back(fmt::format("file system {}: no block device for a direct path", sys.fs_type));
  }
  const bool nvfs_route = sys.nvidia_fs_loaded && sys.nvme_nvfs_hook && sys.on_nvme;
  const std::vector<std::string> p2pdma_lacks = p2pdma_missing(sys.p2pdma);
  const bool p2pdma_route = p2pdma_lacks.empty() && sys.on_nvme;
  if (!nvfs_route && !p2pdma_route) {
    if (!sys.nvidia_fs_loaded) why_not.push_back("nvidia-fs not loaded (no /proc/driver/nvidia-fs)");
    if (sys.kernel_symbols_checked() && !sys.nvme_nvfs_hook) {
      why_not.push_back("NVMe driver without the nvfs hook (no nvme_v1/v2_register_nvfs_dma_ops in /proc/kallsyms)");
    }
    if (!sys.on_nvme) {
      why_not.push_back(sys.block_device.empty() ? "file is not on a block device"
                                                 : fmt::format("file is on {}, not NVMe", sys.block_device));
    }
    if (!p2pdma_lacks.empty()) why_not.push_back(fmt::format("P2PDMA route not ready: {}", fmt::join(p2pdma_lacks, "; ")));
  }
  if (!sys.run_udev) {
    why_not.push_back("/run/udev missing: cuFile cannot register files");
  } else if (!sys.block_device.empty() && !sys.udev_entry) {
    why_not.push_back(fmt::format("no udev data for {}: cuFile cannot register the file", sys.block_device));
  }
  d.direct_possible = why_not.empty();
  switch (mode) {
    case path_mode::gds:
      d.path = data_path::gds;
      d.reasons.push_back("GDSKIT_MODE=gds");
      for (auto& r : why_not) d.reasons.push_back("warning: " + r);
      return d;
    case path_mode::compat:
      d.path = data_path::compat;
      d.reasons.push_back("GDSKIT_MODE=compat: cuFile's own POSIX path (cuFile opened with force_compat_mode for this process)");
      if (!rt.cufile_ok) d.reasons.push_back(rt.cufile_reason);
      return d;
    case path_mode::host:
    case path_mode::staged:
      d.path = data_path::staged;
      d.reasons.push_back(mode == path_mode::host ? "GDSKIT_MODE=host: device buffers go through host memory (staged)"
                                                  : "GDSKIT_MODE=staged");
      break;
    default:
      if (why_not.empty()) {
        d.path = data_path::gds;
        d.reasons.push_back(nvfs_route ? fmt::format("direct path: nvidia-fs {} with the NVMe nvfs hook, file on {}",
                                                     sys.nvidia_fs_version, sys.block_device)
                                       : fmt::format("direct path: PCI P2PDMA, file on {}", sys.block_device));
        return d;
      }
      d.path = data_path::staged;
      break;
  }
  for (auto& r : why_not) d.reasons.push_back(r);
  if (!rt.direct_ok) d.reasons.push_back(rt.direct_reason + ": staged transfers go through the page cache");
  return d;
}

}  // namespace gdskit::engine

namespace gdskit {

std::string_view to_string(data_path p) noexcept {
  switch (p) {
    case data_path::gds: return "gds";
    case data_path::staged: return "staged";
    case data_path::compat: return "compat";
    default: return "host";
  }
}

std::string path_decision::summary() const {
  std::string out(to_string(path));
  if (!reasons.empty()) {
    out += " (";
    for (std::size_t i = 0; i < reasons.size(); ++i) {
      if (i != 0) out += "; ";
      out += reasons[i];
    }
    out += ")";
  }
  return out;
}

}  // namespace gdskit
