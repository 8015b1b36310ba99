// The BIF half of the patch without touching the source: the three overrides are ordinary registry keys that the
// module reads from NVreg_RegistryDwords at load time.
#include <fmt/format.h>

#include "gdskit/error.hpp"
#include "patch/patch.hpp"

namespace gdskit::patch {

registry_dwords make_registry_dwords(const driver_version& v, atomics_mode atomics) {
  registry_dwords r;
  const bool known = v.known();
  if (!known) throw error(errno_code(EINVAL), "registry-dwords: driver version unknown (the value depends on it)");
  const bool new_enum = v.compare(575, 51, 2) >= 0;
  const bool has_atomics = v.compare(565, 57, 1) >= 0;
  const std::string force_p2p = has_atomics && atomics == atomics_mode::default_atomics ? "0x211" : "0x11";
  if (new_enum) {
    r.value = fmt::format("ForceP2P={};RMForceP2PType=1;RMPcieP2PType=1", force_p2p);
  } else {
    // Before 575 the enumeration is DEFAULT=0, MAILBOXP2P=1, BAR1P2P=2, and there is no RMPcieP2PType.
    r.value = fmt::format("ForceP2P={};RMForceP2PType=2", force_p2p);
    r.notes.push_back(fmt::format(
        "driver {}: RMForceP2PType=2 is BAR1P2P here (from 575 on, 2 means NVLINK and 1 means PCIEP2P); "
        "RMPcieP2PType does not exist before 575",
        v.text));
  }
  if (!has_atomics) r.notes.push_back("ForceP2P has no atomics field before 565: 0x11 whatever --atomics says");
  if (force_p2p == "0x11" && has_atomics) {
    r.notes.push_back("ForceP2P=0x11 forces P2P atomics OFF; 0x211 (--atomics default) keeps the chipset default");
  }
  r.notes.push_back(
      "the HAL half of the patch (g_kern_bus_nvoc.c) has no registry key: `gdskit patch apply --only hal` still "
      "needs a module build");
  r.notes.push_back(
      "only one NVreg_RegistryDwords option takes effect: merge with any existing one "
      "(grep -r RegistryDwords /etc/modprobe.d)");
  r.modprobe_conf = fmt::format(
      "# /etc/modprobe.d/gdskit-p2p.conf: P2P overrides of the nvidia module (driver {}).\n"
      "# Same effect as the three source edits in _kbifInitRegistryOverrides. Remove this file to undo,\n"
      "# then rebuild the initramfs if the nvidia module is loaded from it.\n"
      "# NVreg_EnableGpuFirmware=0 is deliberately absent: the open kernel module ignores it.\n"
      "options nvidia NVreg_RegistryDwords=\"{}\"\n",
      v.text, r.value);
  return r;
}

}  // namespace gdskit::patch
