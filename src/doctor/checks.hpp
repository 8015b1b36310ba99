// The doctor's checks, one function per layer. Each reads only through system_root (so a capture holds
// what was read) and never throws on missing, truncated or garbage files: those become `unknown` checks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "doctor/report.hpp"
#include "engine/route_facts.hpp"
#include "doctor/system_root.hpp"

namespace gdskit::doctor {

struct gpu_fact {
  std::string bdf;        // "0000:00:06.0"
  std::string model;      // "NVIDIA H200"
  bool geforce = false;
  std::string sys_path;   // "/sys/devices/pci0000:00/0000:00:06.0" (empty when unknown)
};

/// A version "2.28.4" as numbers; missing parts are 0. Ordered.
struct dotted_version {
  int major = 0, minor = 0, patch = 0;
  auto operator<=>(const dotted_version&) const = default;
};
/// The first "N.N[.N]" in `s` (nvidia-fs versions: "version: 2.28", "NVFS Driver(version: 2.28.4)"); nullopt when
/// none or a part does not fit an int.
std::optional<dotted_version> parse_dotted_version(std::string_view s);
/// "2.28.4", or "2.28" when the patch level is not known.
std::string version_text(const dotted_version& v, bool with_patch);

/// Which direct route the kernel layer found configured: none, nvidia-fs, the PCI P2PDMA route, or both.
struct route_facts {
  bool nvfs_loaded = false;
  std::optional<dotted_version> nvfs_version;  // nvidia-fs's own version (proc/driver/nvidia-fs/version or stats)
  bool nvfs_version_exact = false;             // the patch level is known (from the stats file)
  bool p2pdma_ready = false;                   // every P2PDMA requirement the kernel layer checks is met
  bool nvme_hook = false;                      // the nvme driver exports the hook nvidia-fs looks for
  bool nvme_registered = false;                // nvidia-fs's own modules list or statistics show nvme
  bool nvme_rdma_hook = false;                 // nvme_rdma exports its nvfs hook (NVMe-oF over RDMA)
  /// The route a read of a local NVMe file takes: libcufile prefers P2PDMA when both are usable.
  bool p2pdma() const noexcept { return p2pdma_ready; }
  bool nvfs() const noexcept { return nvfs_loaded && !p2pdma_ready; }
};

/// What one layer learns and a later layer needs.
struct facts {
  std::vector<gpu_fact> gpus;
  bool open_module = false;
  int driver_major = 0;              // 580
  std::string registry_dwords;       // NVreg_RegistryDwords from /proc/driver/nvidia/params
  bool cufile_json_read = false;
  std::optional<bool> use_pci_p2pdma;  // effective properties.use_pci_p2pdma (absent = default false)
  std::optional<bool> udev_database;   // /run/udev/data exists
  bool dmesg_readable = false;
  std::string dmesg;
  bool cufile_log_readable = false;
  std::string cufile_log;
  std::string release;  // running kernel release (proc/sys/kernel/osrelease), empty when unknown
  route_facts route;
};

/// Why a kernel module that should be loaded is not: the cause found in the kernel log (refused symbols of a
/// proprietary driver, version magic, Secure Boot / lockdown), in modules.dep of the running kernel (not
/// installed: DKMS did not build it), in modinfo (version magic, no signature) and in the Secure Boot state.
/// `module` is the name in /proc/modules ("nvidia_fs", "nvidia"). `cause` is empty when nothing is known.
struct load_failure {
  std::string cause;
  std::vector<source_ref> evidence;
  std::string fix;
};
load_failure why_not_loaded(system_root& root, const facts& f, const std::string& module);

/// A line of `text` holding `needle`, scanned from the end (the latest matters); {0, ""} when none.
std::pair<int, std::string> last_line_with(const std::string& text, std::string_view needle);

/// Finds a `key : value` line (nvidia-smi -q, /proc information files) under an optional section header.
/// Returns the value and its 1-based line number, or nullopt.
std::optional<std::pair<std::string, int>> find_field(const std::string& text, const std::string& key,
                                                      const std::string& section = {});
/// Parses a decimal or 0x-hex unsigned number; nullopt on garbage or overflow.
std::optional<std::uint64_t> parse_u64(const std::string& s);

/// A driver version found in a line: engine::driver_version_in, the same parser the planner uses.
using version_token = engine::driver_version_token;
std::optional<version_token> find_version_token(std::string_view line);

/// Whether `s` is a PCI address "dddd:bb:dd.f" (hex digits, function 0-7).
bool is_bdf(std::string_view s) noexcept;
/// The last PCI address inside a sysfs path ("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0" -> the last).
std::string last_bdf_in(std::string_view s);
/// The root complex of a sysfs path ("pci0000:00" from "/sys/devices/pci0000:00/..."), empty when none.
std::string root_complex_in(std::string_view s);

void read_cufile_config(system_root& root, facts& f, layer& userspace);
/// The userspace.cufile_json check of the document `text` read from `rel` (relative to the root); sets what
/// later layers need in `f`. Any bytes are acceptable input. Never throws.
check judge_cufile_json(const std::string& text, const std::string& rel, facts& f);
layer check_gpu(system_root& root, facts& f);
layer check_kernel(system_root& root, facts& f);
void check_userspace(system_root& root, facts& f, layer& userspace);
layer check_storage(system_root& root, facts& f, const std::string& path);
layer check_logs(system_root& root, facts& f);
/// nvidia-fs's own view (kernel layer, when it is loaded): its statistics' error counters and releases with
/// reported regressions.
void check_nvfs_health(system_root& root, facts& f, layer& kernel);

/// Runs every static layer in order (gpu, kernel, userspace, storage, logs).
std::vector<layer> run_checks(system_root& root, const std::string& path);

}  // namespace gdskit::doctor
