// The planner: which data path serves a (file, buffer) pair, and why. Facts come from a system root (/ on a
// live system, a captured folder in tests) so every decision can be replayed on a fixture.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

#include "gdskit/buffer.hpp"
#include "gdskit/path.hpp"
#include "engine/route_facts.hpp"
#include "posix/in_root.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::engine {

/// What the system offers a file on a given device.
struct system_facts {
  bool nvidia_fs_loaded = false;   ///< /proc/driver/nvidia-fs/version exists
  std::string nvidia_fs_version;
  bool nvme_nvfs_hook = false;     ///< nvme_v1/v2_register_nvfs_dma_ops in /proc/kallsyms
  /// The PCI P2PDMA route's facts (use_pci_p2pdma from cufile.json or CUFILE_USE_PCIP2PDMA); judged by
  /// p2pdma_missing, the rule the doctor uses too. p2pdma.kernel_known says whether /proc/kallsyms was read.
  p2pdma_facts p2pdma;
  /// Whether /proc/kallsyms was read. gather_facts reads it only when its symbols could decide the route (the
  /// file is on NVMe, and nvidia-fs is loaded or the P2PDMA route lacks nothing else); otherwise both symbol
  /// facts stay false and neither symbol is given as a reason.
  bool kernel_symbols_checked() const { return p2pdma.kernel_known; }
  bool run_udev = false;           ///< /run/udev is a folder
  bool udev_entry = false;         ///< /run/udev/data/b<maj>:<min> exists for the file's device
  std::string block_device;        ///< "nvme0n1", "vda", "" when not on a block device
  bool on_nvme = false;
  std::string fs_type;             ///< "ext4", "tmpfs", ...
};

/// Reads the facts for a file on device `dev` (st_dev) with file system `fs_type` under `root`: "/" is this
/// machine; any other folder is a captured root, read through posix::root_files (every path resolved inside
/// it, links that leave it refused).
system_facts gather_facts(const std::filesystem::path& root, dev_t dev, const std::string& fs_type);

/// The whole-disk name of the block device `dev` ("nvme0n1" for a partition of it) from root's
/// sys/dev/block/<major>:<minor> link, or "" when it cannot be resolved.
std::string whole_disk_of(const posix::root_files& root, dev_t dev);
/// whole_disk_of, or for a captured root that only has sys/block/<disk>[/<part>]/dev, the disk whose dev file
/// names `dev`; "" when not a block device.
std::string block_device_of(const posix::root_files& root, dev_t dev);

/// What the process can load.
struct runtime_facts {
  bool gpu_ok = false;
  std::string gpu_reason;      ///< why not, when !gpu_ok
  bool cufile_ok = false;
  std::string cufile_reason;   ///< why not, when !cufile_ok
  bool direct_ok = false;      ///< O_DIRECT accepted for this file
  std::string direct_reason;
};

/// The decision for a buffer of `kind` under `mode` (GDSKIT_MODE). Pure: tested on fixture facts.
path_decision decide(const system_facts& sys, const runtime_facts& rt, memory_kind kind, path_mode mode);

}  // namespace gdskit::engine
