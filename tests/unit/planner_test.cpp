// Planner decisions on captured system roots and on synthetic facts.
#include <gtest/gtest.h>

#include <sys/sysmacros.h>

#include <algorithm>
#include <fstream>

#include "doctor/checks.hpp"
#include "engine/planner.hpp"
#include "posix/fs_info.hpp"
#include "test_support.hpp"

namespace gdskit::engine {
namespace {

bool has_reason(const path_decision& d, std::string_view needle) {
  return std::any_of(d.reasons.begin(), d.reasons.end(),
                     [&](const std::string& r) { return r.find(needle) != std::string::npos; });
}

runtime_facts gpu_and_cufile() {
  runtime_facts rt;
  rt.gpu_ok = true;
  rt.cufile_ok = true;
  rt.direct_ok = true;
  return rt;
}

TEST(planner, real_capture_h200_vm_goes_staged_with_reasons) {
  // The shared copy when it is beside the checkout, else the copy kept in the tree.
  std::filesystem::path root = std::filesystem::path(GDSKIT_SHARED_DIR) / "fixtures/systems/h200-vm-no-nvfs";
  if (!std::filesystem::exists(root)) root = std::filesystem::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/systems/h200-vm-no-nvfs";
  ASSERT_TRUE(std::filesystem::exists(root)) << root;
  system_facts f = gather_facts(root, makedev(254, 0), "ext4");
  EXPECT_FALSE(f.nvidia_fs_loaded);
  EXPECT_FALSE(f.nvme_nvfs_hook);
  EXPECT_FALSE(f.run_udev);
  EXPECT_EQ(f.block_device, "vda");
  EXPECT_FALSE(f.on_nvme);
  // Not on NVMe: no route can be made, so kallsyms is not read and its symbols are not given as reasons.
  EXPECT_FALSE(f.kernel_symbols_checked());
  path_decision d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "nvidia-fs not loaded"));
  EXPECT_FALSE(has_reason(d, "nvfs hook"));
  EXPECT_FALSE(has_reason(d, "p2pdma_pgmap_ops"));
  EXPECT_TRUE(has_reason(d, "/run/udev missing"));
  EXPECT_TRUE(has_reason(d, "vda, not NVMe"));
}

TEST(planner, synthetic_root_with_nvfs_and_nvme_goes_gds) {
  test::temp_dir root;
  auto mk = [&](const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root.path() / rel).parent_path());
    std::ofstream(root.path() / rel) << text;
  };
  mk("proc/driver/nvidia-fs/version", "version: 2.28.4\n");
  mk("proc/kallsyms", "0000000000000000 T nvme_v1_register_nvfs_dma_ops\t[nvme]\n");
  mk("run/udev/data/b259:0", "E:ID_FS_USAGE=filesystem\n");
  mk("sys/block/nvme0n1/dev", "259:0\n");
  system_facts f = gather_facts(root.path(), makedev(259, 0), "ext4");
  EXPECT_TRUE(f.nvidia_fs_loaded);
  EXPECT_TRUE(f.kernel_symbols_checked());
  EXPECT_TRUE(f.nvme_nvfs_hook);
  EXPECT_TRUE(f.on_nvme);
  EXPECT_TRUE(f.udev_entry);
  path_decision d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::gds) << d.summary();
  EXPECT_TRUE(d.direct_possible);
  EXPECT_TRUE(decide(f, gpu_and_cufile(), memory_kind::device, path_mode::staged).direct_possible);
  EXPECT_TRUE(has_reason(d, "nvidia-fs version: 2.28.4"));
  // The same system without libcufile stages, and says why.
  runtime_facts rt = gpu_and_cufile();
  rt.cufile_ok = false;
  rt.cufile_reason = "libcufile.so.0 not found";
  d = decide(f, rt, memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "libcufile.so.0 not found"));
  // The same NVMe disk without nvidia-fs (and no P2PDMA set-up): kallsyms is not read, the hook not claimed.
  std::filesystem::remove_all(root.path() / "proc/driver/nvidia-fs");
  f = gather_facts(root.path(), makedev(259, 0), "ext4");
  EXPECT_FALSE(f.kernel_symbols_checked());
  EXPECT_FALSE(f.nvme_nvfs_hook);
  d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "nvidia-fs not loaded"));
  EXPECT_FALSE(has_reason(d, "nvfs hook"));
  // Partitions resolve to their disk.
  mk("sys/block/nvme0n1/nvme0n1p2/dev", "259:2\n");
  EXPECT_EQ(gather_facts(root.path(), makedev(259, 2), "xfs").block_device, "nvme0n1");
}

TEST(planner, links_that_leave_a_captured_root_are_not_followed) {
  // Every file the planner reads is a link out of the root, to files that would make a direct route (and put
  // a marker into its reasons): none is read, and the marker never reaches a decision.
  const std::string marker = "MARKER-OUTSIDE-THE-ROOT";
  test::temp_dir t;
  const auto outside = t.path() / "outside";
  test::write_text(outside / "nvfs-version", "version: " + marker + "\n");
  test::write_text(outside / "kallsyms", "0000000000000000 T nvme_v1_register_nvfs_dma_ops\t[nvme]\n");
  test::write_text(outside / "cufile.json", "{ \"properties\": { \"use_pci_p2pdma\": true } }\n");
  test::write_text(outside / "udev/b259:0", "E:ID_FS_USAGE=filesystem\n");
  test::write_text(outside / ("block/" + marker) / "dev", "259:0\n");
  const auto root = t.path() / "root";
  for (const char* d : {"proc/driver/nvidia-fs", "etc", "run/udev/data", "sys/dev/block", "sys/block"})
    std::filesystem::create_directories(root / d);
  // Absolute links, and relative ones that climb above the root.
  std::filesystem::create_symlink(outside / "nvfs-version", root / "proc/driver/nvidia-fs/version");
  std::filesystem::create_symlink("../outside/kallsyms", root / "proc/kallsyms");
  std::filesystem::create_symlink("../../outside/cufile.json", root / "etc/cufile.json");
  std::filesystem::create_symlink(outside / "udev/b259:0", root / "run/udev/data/b259:0");
  std::filesystem::create_directory_symlink(outside / "block" / marker, root / "sys/dev/block/259:0");
  std::filesystem::create_directory_symlink("../../../outside/block/" + marker, root / "sys/block/nvme0n1");
  const system_facts f = gather_facts(root, makedev(259, 0), "ext4");
  EXPECT_FALSE(f.nvidia_fs_loaded);
  EXPECT_EQ(f.nvidia_fs_version.find(marker), std::string::npos);
  EXPECT_FALSE(f.p2pdma.use_pci_p2pdma);
  EXPECT_FALSE(f.udev_entry);
  EXPECT_EQ(f.block_device, "");
  EXPECT_FALSE(f.on_nvme);
  for (auto mode : {path_mode::automatic, path_mode::gds, path_mode::staged}) {
    const path_decision d = decide(f, gpu_and_cufile(), memory_kind::device, mode);
    EXPECT_EQ(d.summary().find(marker), std::string::npos) << d.summary();
  }
  EXPECT_NE(decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic).path, data_path::gds);
  // The same files inside the root, reached by links that stay inside it, are read.
  test::write_text(root / "in/nvfs-version", "version: 2.28.4\n");
  std::filesystem::remove(root / "proc/driver/nvidia-fs/version");
  std::filesystem::create_symlink("../../../in/nvfs-version", root / "proc/driver/nvidia-fs/version");
  test::write_text(root / "sys/devices/pci0000:00/nvme0n1/dev", "259:0\n");
  std::filesystem::remove(root / "sys/dev/block/259:0");
  std::filesystem::create_directory_symlink("../../devices/pci0000:00/nvme0n1", root / "sys/dev/block/259:0");
  const system_facts inside = gather_facts(root, makedev(259, 0), "ext4");
  EXPECT_TRUE(inside.nvidia_fs_loaded);
  EXPECT_EQ(inside.nvidia_fs_version, "version: 2.28.4");
  EXPECT_EQ(inside.block_device, "nvme0n1");
}

TEST(planner, modes_and_buffers) {
  system_facts none;
  none.fs_type = "tmpfs";
  runtime_facts rt = gpu_and_cufile();
  rt.direct_ok = false;
  rt.direct_reason = "tmpfs refuses O_DIRECT";
  EXPECT_EQ(decide(none, rt, memory_kind::host, path_mode::automatic).path, data_path::host);
  EXPECT_EQ(decide(none, rt, memory_kind::pinned, path_mode::gds).path, data_path::host);
  auto staged = decide(none, rt, memory_kind::device, path_mode::automatic);
  EXPECT_EQ(staged.path, data_path::staged);
  EXPECT_TRUE(has_reason(staged, "file system tmpfs"));
  EXPECT_TRUE(has_reason(staged, "tmpfs refuses O_DIRECT"));
  // The plan serves a save as well as a load: its reasons name no one direction.
  for (const auto& r : staged.reasons) EXPECT_EQ(r.find("reads"), std::string::npos) << r;
  auto forced = decide(none, rt, memory_kind::device, path_mode::gds);
  EXPECT_EQ(forced.path, data_path::gds);
  EXPECT_FALSE(forced.direct_possible);  // gds only because it was forced: bench -x gds refuses this
  EXPECT_TRUE(has_reason(forced, "warning: nvidia-fs not loaded"));
  EXPECT_EQ(decide(none, rt, memory_kind::device, path_mode::compat).path, data_path::compat);
  EXPECT_EQ(decide(none, rt, memory_kind::device, path_mode::staged).path, data_path::staged);
  auto managed = decide(none, rt, memory_kind::managed, path_mode::automatic);
  EXPECT_TRUE(has_reason(managed, "managed memory"));
  runtime_facts nogpu;
  nogpu.gpu_reason = "libcuda.so.1 not found";
  EXPECT_TRUE(has_reason(decide(none, nogpu, memory_kind::device, path_mode::automatic), "no usable GPU"));
}

// The doctor's kernel.p2pdma check on the same root.
const doctor::check* doctor_p2pdma(const std::filesystem::path& root, std::vector<doctor::layer>& layers) {
  auto r = doctor::system_root::captured(root);
  layers = doctor::run_checks(r, "/data");
  for (const auto& l : layers)
    for (const auto& c : l.checks)
      if (c.id == "kernel.p2pdma") return &c;
  return nullptr;
}

TEST(planner, p2pdma_route_is_judged_by_the_doctors_rule) {
  test::temp_dir root;
  auto mk = [&](const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root.path() / rel).parent_path());
    std::ofstream(root.path() / rel) << text;
  };
  // use_pci_p2pdma alone, on NVMe with udev data: not a route (stock kernel, no static BAR1, driver unknown).
  mk("etc/cufile.json", "{ \"properties\": { \"use_pci_p2pdma\": true } }\n");
  mk("proc/kallsyms", "0000000000000000 T nvme_setup_cmd\t[nvme]\n");
  mk("run/udev/data/b259:0", "E:ID_FS_USAGE=filesystem\n");
  mk("sys/block/nvme0n1/dev", "259:0\n");
  mk("proc/self/mountinfo", "22 1 259:0 / / rw - ext4 /dev/nvme0n1 rw,data=ordered\n");
  system_facts f = gather_facts(root.path(), makedev(259, 0), "ext4");
  EXPECT_TRUE(f.p2pdma.use_pci_p2pdma);
  path_decision d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged) << d.summary();
  EXPECT_FALSE(d.direct_possible);
  std::vector<doctor::layer> layers;
  const doctor::check* c = doctor_p2pdma(root.path(), layers);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->state, doctor::status::ok);
  for (const auto& why : p2pdma_missing(f.p2pdma)) {
    EXPECT_TRUE(has_reason(d, why)) << why;
    EXPECT_NE(c->summary.find(why), std::string::npos) << why << " / " << c->summary;
  }
  // All but use_pci_p2pdma and the kernel's symbol: kallsyms is read only when it alone could decide.
  EXPECT_FALSE(f.kernel_symbols_checked());
  EXPECT_EQ(p2pdma_missing(f.p2pdma).size(), 2u);
  EXPECT_FALSE(has_reason(d, "p2pdma_pgmap_ops"));

  // Every P2PDMA fact in place: both call it a direct route.
  mk("proc/kallsyms", "ffffffff81000000 T p2pdma_pgmap_ops\n");
  mk("proc/driver/nvidia/version",
     "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (builder@host)\n");
  mk("proc/driver/nvidia/params", "EnableGpuFirmware: 18\nRegistryDwords: \"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\"\n");
  f = gather_facts(root.path(), makedev(259, 0), "ext4");
  EXPECT_TRUE(f.kernel_symbols_checked());
  EXPECT_TRUE(p2pdma_missing(f.p2pdma).empty());
  d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::gds) << d.summary();
  EXPECT_TRUE(has_reason(d, "direct path: PCI P2PDMA"));
  // Everything but the kernel's symbol: kallsyms is read, and its answer is the reason.
  mk("proc/kallsyms", "ffffffff81000000 T nvme_setup_cmd\t[nvme]\n");
  f = gather_facts(root.path(), makedev(259, 0), "ext4");
  EXPECT_TRUE(f.kernel_symbols_checked());
  EXPECT_TRUE(p2pdma_missing_outside_kernel(f.p2pdma).empty());
  ASSERT_EQ(p2pdma_missing(f.p2pdma).size(), 1u);
  EXPECT_NE(p2pdma_missing(f.p2pdma).front().find("p2pdma_pgmap_ops"), std::string::npos);
  d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "p2pdma_pgmap_ops")) << d.summary();
  mk("proc/kallsyms", "ffffffff81000000 T p2pdma_pgmap_ops\n");
  f = gather_facts(root.path(), makedev(259, 0), "ext4");
  c = doctor_p2pdma(root.path(), layers);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->state, doctor::status::ok) << c->summary;
  // One fact away (the open driver is too old): both refuse it, with the same reason.
  mk("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release\n");
  f = gather_facts(root.path(), makedev(259, 0), "ext4");
  d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  c = doctor_p2pdma(root.path(), layers);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "needs the open driver >= 565"));
  EXPECT_NE(c->summary.find("needs the open driver >= 565"), std::string::npos);
}

TEST(planner, file_system_magics_name_the_right_file_system) {
  // virtiofs is FUSE (FUSE_SUPER_MAGIC); 0x6E667364 is NFSD_MAGIC, the nfsd control file system.
  EXPECT_EQ(posix::fs_type_name(0x65735546), "fuse");
  EXPECT_EQ(posix::fs_type_name(0x6E667364), "nfsd");
  EXPECT_EQ(posix::fs_type_name(0xEF53), "ext4");
  system_facts f;
  f.fs_type = posix::fs_type_name(0x65735546);
  f.run_udev = true;
  auto d = decide(f, gpu_and_cufile(), memory_kind::device, path_mode::automatic);
  EXPECT_EQ(d.path, data_path::staged);
  EXPECT_TRUE(has_reason(d, "not on a block device"));
}

}  // namespace
}  // namespace gdskit::engine
