#include "engine/planner.hpp"

#include <sys/sysmacros.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gdskit::engine {
namespace {

bool path_exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

bool file_contains_symbol(const std::filesystem::path& p, std::initializer_list<const char*> symbols) {
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    for (const char* s : symbols) {
      // kallsyms lines end with the symbol name, optionally followed by "\t[module]".
      auto pos = line.find(s);
      if (pos != std::string::npos && (pos == 0 || line[pos - 1] == ' ' || line[pos - 1] == '\t')) return true;
    }
  }
  return false;
}

// The live system's kallsyms holds a few hundred thousand lines (tens of milliseconds to scan), and every file
// opened for a GPU read asks; the answer only changes when the NVMe module is swapped, so it is kept a while.
bool nvme_hook_present(const std::filesystem::path& root) {
  static constexpr std::initializer_list<const char*> k_symbols = {"nvme_v1_register_nvfs_dma_ops",
                                                                   "nvme_v2_register_nvfs_dma_ops"};
  if (root != "/") return file_contains_symbol(root / "proc/kallsyms", k_symbols);
  static std::mutex mutex;
  static std::optional<bool> cached;
  static std::chrono::steady_clock::time_point when;
  std::lock_guard lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (!cached || now - when > std::chrono::seconds(30)) {
    cached = file_contains_symbol("/proc/kallsyms", k_symbols);
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
  std::ifstream in(json);
  if (!in) return false;
  try {
    auto j = nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
    auto props = j.find("properties");
    if (props != j.end() && props->is_object()) {
      auto v = props->find("use_pci_p2pdma");
      if (v != props->end() && v->is_boolean()) return v->get<bool>();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return false;
}

std::string read_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
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
  std::ifstream ver(root / "proc/driver/nvidia-fs/version");
  if (ver) {
    f.nvidia_fs_loaded = true;
    std::getline(ver, f.nvidia_fs_version);
  }
  f.nvme_nvfs_hook = nvme_hook_present(root);
  f.p2pdma_requested = cufile_json_requests_p2pdma(root);
  std::error_code ec;
  f.run_udev = std::filesystem::is_directory(root / "run/udev", ec);
  if (major(dev) != 0) f.udev_entry = path_exists(root / fmt::format("run/udev/data/b{}:{}", major(dev), minor(dev)));
  f.block_device = block_device_of(root, dev);
  f.on_nvme = f.block_device.rfind("nvme", 0) == 0;
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
  const bool p2pdma_route = sys.p2pdma_requested && sys.on_nvme;
  if (!nvfs_route && !p2pdma_route) {
    if (!sys.nvidia_fs_loaded) why_not.push_back("nvidia-fs not loaded (no /proc/driver/nvidia-fs)");
    if (!sys.nvme_nvfs_hook) {
      why_not.push_back("NVMe driver without the nvfs hook (no nvme_v1/v2_register_nvfs_dma_ops in /proc/kallsyms)");
    }
    if (!sys.on_nvme) {
      why_not.push_back(sys.block_device.empty() ? "file is not on a block device"
                                                 : fmt::format("file is on {}, not NVMe", sys.block_device));
    }
    if (!sys.p2pdma_requested) why_not.push_back("PCI P2PDMA not enabled (cufile.json properties.use_pci_p2pdma)");
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
      d.reasons.push_back("GDSKIT_MODE=compat: cuFile's own POSIX path");
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
  if (!rt.direct_ok) d.reasons.push_back(rt.direct_reason + ": staged reads use the page cache");
  return d;
}

}  // namespace gdskit::engine
