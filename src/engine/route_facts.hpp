// The rules for a direct (P2P DMA) route between NVMe and GPU memory, in one place: the planner and the doctor
// both judge the same facts with these functions, so they give the same answer and the same reasons for it
// (the planner leaves out the kernel's symbols when it did not read them: the route lacked something else).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gdskit::engine {

/// What the PCI P2PDMA route (no nvidia-fs) needs, as read from a system root.
struct p2pdma_facts {
  bool kernel_p2pdma = false;   ///< p2pdma_pgmap_ops in /proc/kallsyms (CONFIG_PCI_P2PDMA)
  bool kernel_known = true;     ///< false: kallsyms was not read (the route lacks something else); not listed
  bool open_module = false;     ///< /proc/driver/nvidia/version says "Open Kernel Module"
  int driver_major = 0;         ///< 580; 0 when unknown
  bool static_bar1 = false;     ///< NVreg_RegistryDwords holds RMForceStaticBar1=1
  bool use_pci_p2pdma = false;  ///< cufile.json properties.use_pci_p2pdma
};

/// What the P2PDMA route still lacks, in the order to fix it; empty when the route is configured.
std::vector<std::string> p2pdma_missing(const p2pdma_facts& f);
/// The same, leaving out the kernel's support (which takes /proc/kallsyms to know).
std::vector<std::string> p2pdma_missing_outside_kernel(const p2pdma_facts& f);

/// Whether an NVreg_RegistryDwords value ("RMForceStaticBar1=1;RmForceDisableIomapWC=1;") sets static BAR1.
bool registry_sets_static_bar1(std::string_view registry_dwords) noexcept;

/// A driver version found in a line ("NVRM version: ... 580.95.05 ..."): the first run of 3 or more digits
/// followed by '.' and digits (and optionally one more '.' and digits). The major must fit an int or the token
/// is rejected. Linear in the line's length, no recursion: safe on captured text of any size.
struct driver_version_token {
  std::string text;  // "580.95.05"
  int major = 0;
};
std::optional<driver_version_token> driver_version_in(std::string_view line);

}  // namespace gdskit::engine
