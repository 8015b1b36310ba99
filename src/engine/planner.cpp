#include "engine/planner.hpp"

#include <sys/sysmacros.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "posix/bounded_read.hpp"
#include "posix/in_root.hpp"

namespace gdskit::engine {
namespace {

// Which of `symbols` /proc/kallsyms (or a captured copy) names, as a bit per symbol. Bounded like the doctor's
// scan: a device or FIFO in a captured root is not read, an endless file stops at the limit.
unsigned kallsyms_has(const posix::root_files& root, std::initializer_list<const char*> symbols) {
  unsigned found = 0;
  (void)root.scan_lines("proc/kallsyms", 256u << 20, 4096, [&](std::string_view line) {
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
unsigned kernel_symbols(const posix::root_files& root) {
  auto scan = [&] {
    const unsigned bits =
        kallsyms_has(root, {"nvme_v1_register_nvfs_dma_ops", "nvme_v2_register_nvfs_dma_ops", "p2pdma_pgmap_ops"});
    return ((bits & 3u) != 0 ? 1u : 0u) | ((bits & 4u) != 0 ? 2u : 0u);
  };
  if (!root.live()) return scan();
  static std::mutex mutex;
  static std::optional<unsigned> cached;
  static std::chrono::steady_clock::time_point when;
  std::lock_guard lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (!cached || now - when > std::chrono::seconds(30)) {
    cached = scan();
    when = now;
  }
  return *cached;
}

bool cufile_json_requests_p2pdma(const posix::root_files& root) {
  if (const char* env = std::getenv("CUFILE_USE_PCIP2PDMA"); env != nullptr && root.live()) {
    return std::string_view(env) == "true" || std::string_view(env) == "1";
  }
  // This process's own setting names a file of the live machine; a captured root has its etc/cufile.json.
  const char* env = root.live() ? std::getenv("CUFILE_ENV_PATH_JSON") : nullptr;
  auto text = env != nullptr ? read_bounded(env, 1 << 20) : root.read("etc/cufile.json", 1 << 20);
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

std::string read_line(const posix::root_files& root, const std::string& rel) {
  std::string text = root.read(rel, 64 * 1024).text.value_or("");
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

std::string last_component(std::string_view p) {
  const auto slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

}  // namespace

std::string whole_disk_of(const posix::root_files& root, dev_t dev) {
  auto target = root.resolve(fmt::format("sys/dev/block/{}:{}", major(dev), minor(dev)));
  if (!target || target->empty()) return {};
  // A partition's folder sits in its disk's.
  if (root.exists(*target + "/partition")) {
    const auto slash = target->rfind('/');
    target->resize(slash == std::string::npos ? 0 : slash);
  }
  return last_component(*target);
}

std::string block_device_of(const posix::root_files& root, dev_t dev) {
  if (major(dev) == 0) return {};  // tmpfs, overlay and other virtual file systems
  if (std::string disk = whole_disk_of(root, dev); !disk.empty()) return disk;
  // A captured root may only have /sys/block/<disk>[/<part>]/dev, which is searched instead.
  const std::string want = fmt::format("{}:{}", major(dev), minor(dev));
  std::error_code ec;
  auto disks = root.list("sys/block", ec, 4096);
  std::sort(disks.begin(), disks.end());
  for (const auto& disk : disks) {
    const std::string dir = "sys/block/" + disk;
    if (read_line(root, dir + "/dev") == want) return disk;
    std::error_code ec2;
    for (const auto& part : root.list(dir, ec2, 4096)) {
      if (read_line(root, dir + "/" + part + "/dev") == want) return disk;
    }
  }
  return {};
}

system_facts gather_facts(const std::filesystem::path& root_dir, dev_t dev, const std::string& fs_type) {
  // "/" is this machine; any other folder a captured root, whose every read is resolved inside it.
  const posix::root_files root(root_dir);
  system_facts f;
  f.fs_type = fs_type;
  if (auto ver = root.read("proc/driver/nvidia-fs/version", 64 * 1024); ver.ok()) {
    f.nvidia_fs_loaded = true;
    f.nvidia_fs_version = ver.text->substr(0, ver.text->find('\n'));
  }
  const std::string nv = read_line(root, "proc/driver/nvidia/version");
  f.p2pdma.open_module = nv.find("Open Kernel Module") != std::string::npos;
  if (auto v = driver_version_in(nv)) f.p2pdma.driver_major = v->major;
  // "RegistryDwords: "..."" in the driver's parameter list.
  const std::string params = root.read("proc/driver/nvidia/params", 1 << 20).text.value_or("");
  for (std::size_t pos = 0; pos < params.size();) {
    auto nl = params.find('\n', pos);
    if (nl == std::string::npos) nl = params.size();
    const std::string_view line(params.data() + pos, nl - pos);
    if (line.rfind("RegistryDwords:", 0) == 0) f.p2pdma.static_bar1 = registry_sets_static_bar1(line.substr(15));
    pos = nl + 1;
  }
  f.p2pdma.use_pci_p2pdma = cufile_json_requests_p2pdma(root);
  f.run_udev = root.is_directory("run/udev");
  if (major(dev) != 0) f.udev_entry = root.exists(fmt::format("run/udev/data/b{}:{}", major(dev), minor(dev)));
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
