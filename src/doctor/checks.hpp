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
};

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

/// Runs every static layer in order (gpu, kernel, userspace, storage, logs).
std::vector<layer> run_checks(system_root& root, const std::string& path);

}  // namespace gdskit::doctor
