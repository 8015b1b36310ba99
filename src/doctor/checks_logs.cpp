// Logs layer: what the kernel (dmesg) and libcufile (cufile.log) said, with the meaning of each line.
#include <fmt/format.h>

#include "doctor/checks.hpp"

namespace gdskit::doctor {
namespace {

struct pattern {
  const char* needle;
  status state;
  impact blocks;
  const char* meaning;
  const char* fix;
};

// dmesg lines from nvidia-fs and the NVIDIA driver's P2P API.
const pattern dmesg_patterns[] = {
    {"Error ret -22", status::fail, impact::direct,
     "nvidia_p2p_get_pages -22 (EINVAL): the driver refused the P2P pin; no third-party P2P registration for the "
     "process (GeForce without the P2P object, or a stock driver)",
     "On GeForce build the open module with the gdskit P2P patch (gdskit patch); otherwise use a data-center GPU."},
    {"Error ret -12", status::fail, impact::direct,
     "nvidia_p2p_get_pages -12 (ENOMEM): BAR1 space exhausted",
     "Enable Resizable BAR, or register smaller GPU buffers (cufile.json max_device_pinned_mem_size_kb)."},
    {"Error ret -524", status::fail, impact::direct,
     "-524 (ENOTSUPP): the operation is not supported by the driver on this platform",
     "Check the driver flavour (open module) and platform (bare metal, IOMMU off)."},
    {"nvfs registration failed", status::fail, impact::direct,
     "a storage driver refused nvidia-fs's DMA ops (feature bits of nvidia-fs and the nvme hook do not match)",
     "Use matching nvidia-fs and kernel (nvme hook v1 vs v2)."},
    {"nvfs modules probe failed", status::fail, impact::direct, "nvidia-fs could not probe the storage drivers",
     "Reload nvidia-fs after nvme; check dmesg above this line."},
    {"deregister funtion not found", status::fail, impact::direct,
     "the storage driver exports only half of the nvfs hook", "Use a kernel whose nvme driver carries the full hook."},
    {"not sector aligned", status::warn, impact::none, "an IO was not 512-byte aligned; it failed in nvidia-fs",
     "Keep file offsets and sizes 4 KiB aligned."},
    {"O_DIRECT flag is not set", status::warn, impact::none, "nvidia-fs got a file descriptor without O_DIRECT",
     "Open files with O_DIRECT (or let cuFile open its own)."},
    {"Incompatible page table version", status::fail, impact::direct,
     "nvidia-fs and the NVIDIA driver disagree on the P2P page table version: every GPU buffer pin fails",
     "Install an nvidia-fs release built for this driver series (rebuild it with dkms against the loaded driver)."},
    {"kernel BUG at", status::fail, impact::direct,
     "nvidia-fs crashed inside the kernel (BUG): its state is undefined until the next boot",
     "Reboot; then fix the error logged just before the crash (often a pin failure); report the trace to NVIDIA."},
};

// cufile.log lines.
const pattern cufile_patterns[] = {
    {"udev property not found", status::fail, impact::cufile,
     "cuFile found no udev data for the device: cuFileHandleRegister fails with 5027",
     "Provide /run/udev/data (run udevd or bind-mount /run/udev)."},
    {"error creating udev_device", status::fail, impact::cufile,
     "cuFile found no udev device for the file's block device (tmpfs or no udev)", "Provide /run/udev/data."},
    {"running in compatible mode", status::fail, impact::direct,
     "libcufile opened in compat mode: IO bounces through host memory", "Fix the kernel layer (nvidia-fs, nvme hook)."},
    {"forcing cufile into compatible mode", status::fail, impact::direct, "compat mode was forced by configuration",
     "Unset CUFILE_FORCE_COMPAT_MODE / properties.force_compat_mode."},
    {"GDS not supported or disabled by config", status::fail, impact::direct,
     "this file is served by cuFile's POSIX path", "See the storage layer."},
    {"NVMe Driver not registered with nvidia-fs", status::fail, impact::direct,
     "nvidia-fs has no NVMe hook: the nvme driver is stock", "Boot a kernel with the nvme nvfs hook."},
    {"nvidia-fs.ko driver not loaded", status::fail, impact::direct, "nvidia-fs is not loaded", "modprobe nvidia-fs."},
    {"Unsupported block device", status::fail, impact::direct, "the file's block device (dm, loop) is not supported",
     "Use a plain NVMe partition or MD RAID0."},
    {"bar1 memory not available", status::fail, impact::direct, "no BAR1 space: only compat mode is possible",
     "Enable Resizable BAR / Above 4G Decoding."},
    {"nvidia-fs MAP ioctl failed", status::fail, impact::direct,
     "nvidia-fs could not pin the GPU buffer (the NVIDIA driver refused the P2P pin): cuFileBufRegister fails and IO "
     "goes through host memory",
     "On GeForce the stock driver refuses the pin (see gpu.class); check dmesg for nvidia_p2p errors."},
    {"error allocating nvfs handle", status::fail, impact::direct,
     "cuFileBufRegister could not get a buffer from nvidia-fs", "See the nvidia-fs lines of dmesg at the same time."},
    {"GPUDirect Storage not supported on current file", status::fail, impact::direct,
     "cuFile refused the direct path for this file (strict mode fails, compat mode bounces through host memory)",
     "See the kernel and storage layers for the cause."},
    {"pci_p2pdma not supported", status::warn, impact::none,
     "CUDA reports no PCI P2PDMA for this GPU with the current driver settings (static BAR1 missing, or GPU/driver "
     "too old): the P2PDMA route is unavailable",
     "options nvidia NVreg_RegistryDwords=\"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\" and reboot (see kernel.p2pdma)."},
};

void scan(const std::string& text, const std::string& source, const pattern* begin, const pattern* end,
          const std::string& id_prefix, layer& out, bool only_gds_lines) {
  auto lines = split_lines(text);
  for (const pattern* p = begin; p != end; ++p) {
    for (std::size_t i = lines.size(); i-- > 0;) {  // the latest occurrence is the relevant one
      const auto& l = lines[i];
      if (l.find(p->needle) == std::string::npos) continue;
      if (only_gds_lines && l.find("nvidia-fs") == std::string::npos && l.find("nvidia_fs") == std::string::npos &&
          l.find("nvfs") == std::string::npos && l.find("nvidia_p2p") == std::string::npos && l.find("NVRM") == std::string::npos)
        continue;
      check c{id_prefix, std::string("log: ") + p->needle, p->state, p->blocks, p->meaning, {}, p->fix};
      c.evidence.push_back({source, static_cast<int>(i + 1), trim(l)});
      out.checks.push_back(std::move(c));
      break;
    }
  }
}

}  // namespace

layer check_logs(system_root&, facts& f) {
  layer out{"logs", "Logs (dmesg, cufile.log)", {}};
  {
    check c{"logs.dmesg", "Kernel log", status::ok, impact::none, "", {}, ""};
    if (!f.dmesg_readable) {
      c.state = status::unknown;
      c.summary = "dmesg not readable (restricted to root: kernel.dmesg_restrict=1)";
      c.fix = "Run as root, or sudo dmesg | grep -e nvidia-fs -e nvidia_p2p -e NVRM.";
      out.checks.push_back(std::move(c));
    } else {
      std::size_t nvfs = 0;
      for (const auto& l : split_lines(f.dmesg))
        if (l.find("nvidia-fs") != std::string::npos || l.find("nvidia_fs") != std::string::npos ||
            l.find("nvidia_p2p") != std::string::npos)
          ++nvfs;
      c.summary = fmt::format("{} nvidia-fs / nvidia_p2p line(s) in dmesg", nvfs);
      c.evidence.push_back({"commands/dmesg.txt", 0, c.summary});
      out.checks.push_back(std::move(c));
      scan(f.dmesg, "commands/dmesg.txt", std::begin(dmesg_patterns), std::end(dmesg_patterns), "logs.dmesg_error", out, true);
    }
  }
  {
    check c{"logs.cufile", "cufile.log", status::ok, impact::none, "", {}, ""};
    if (!f.cufile_log_readable) {
      c.summary = "no cufile.log (run a cuFile program in this folder, or set CUFILE_LOGFILE_PATH)";
      out.checks.push_back(std::move(c));
    } else {
      c.summary = fmt::format("{} line(s) read", split_lines(f.cufile_log).size());
      c.evidence.push_back({"commands/cufile-log.txt", 0, c.summary});
      out.checks.push_back(std::move(c));
      scan(f.cufile_log, "commands/cufile-log.txt", std::begin(cufile_patterns), std::end(cufile_patterns),
           "logs.cufile_error", out, false);
      // The static checks call the P2PDMA route configured, libcufile's own probe says it is not: contradicting
      // evidence, so the route is not proven.
      for (auto& c : out.checks) {
        if (c.title == "log: pci_p2pdma not supported" && f.route.p2pdma_ready) {
          c.state = status::fail;
          c.blocks = impact::direct;
        }
      }
    }
  }
  return out;
}

}  // namespace gdskit::doctor
