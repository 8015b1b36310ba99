// The data path that moves bytes between a file and a buffer, and why it was chosen.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gdskit {

/// gds: cuFile with a direct path (P2P DMA). staged: gdskit's pipeline through pinned host memory.
/// compat: cuFile's own POSIX mode (only when asked for). host: the buffer is host memory.
enum class data_path { gds, staged, compat, host };

std::string_view to_string(data_path p) noexcept;

/// The planner's decision for one (file, buffer) pair.
struct path_decision {
  data_path path = data_path::host;
  /// Why this path, and why not GDS: "nvidia-fs not loaded", "/run/udev missing: cuFile cannot register
  /// files", "tmpfs refuses O_DIRECT", "GDSKIT_MODE=staged", ... Never empty for a GPU buffer.
  std::vector<std::string> reasons;
  /// Whether the system facts show a direct DMA route for this file (nvidia-fs with the NVMe hook and the file
  /// on NVMe, or PCI P2PDMA) that cuFile can use. False when the path is gds only because it was forced.
  bool direct_possible = false;
  /// "staged (nvidia-fs not loaded; libcufile not found)"
  std::string summary() const;
};

}  // namespace gdskit
