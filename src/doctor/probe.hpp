// The live proof: what happened when cuFile was actually driven on this machine. The static checks say
// what should be possible; these results say what the hardware and libraries did.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace gdskit::doctor {

/// One cuFile call's outcome: `code` 0 = success, else the CUfileOpError value (5001..) or -errno.
struct probe_step {
  bool attempted = false;
  int code = 0;
  std::string message;  // "CU_FILE_HANDLE_NOT_REGISTERED", "ok", ...
  bool succeeded() const noexcept { return attempted && code == 0; }
};

/// Per-GPU cuFile counters (CUfilePerGpuStats_t) that tell the paths apart, as a delta over the probe.
struct io_path_counts {
  std::uint64_t reads = 0;
  std::uint64_t p2p_reads = 0;    // PCI P2PDMA
  std::uint64_t nvfs_reads = 0;   // nvidia-fs
  std::uint64_t posix_reads = 0;  // compat: bounced through host memory
  std::uint64_t writes = 0;
  std::uint64_t p2p_writes = 0;
  std::uint64_t nvfs_writes = 0;
  std::uint64_t posix_writes = 0;
};

/// One point of the queue-depth sweep.
struct sweep_point {
  int queue_depth = 1;
  std::uint64_t io_size_bytes = 0;
  double gib_per_s = 0.0;
};

struct probe_results {
  bool ran = false;
  std::string skipped_reason;  // why no probe ran ("no GPU", "offline root", "libcufile.so.0 not found")
  std::string file;            // the test file under --path

  probe_step cuda_init;              // cuInit + context on GPU 0
  probe_step driver_open_default;    // cuFileDriverOpen with the system configuration
  probe_step driver_open_strict;     // cuFileDriverOpen with allow_compat_mode=false (private cufile.json)
  probe_step handle_register;        // cuFileHandleRegister on the test file (default configuration)
  probe_step buf_register;           // cuFileBufRegister of a device buffer
  probe_step strict_write;           // write + read back under the strict configuration
  probe_step strict_read;
  probe_step default_write;          // write + read back under the default configuration
  probe_step default_read;
  bool data_verified = false;        // bytes read back equal bytes written

  std::optional<io_path_counts> cufile_stats_delta;  // absent when cuFile stats were unavailable
  /// nvidia-fs /proc stats: Reads n (needs rw_stats_enabled=1) and Bar1-map n over the probe.
  std::optional<std::uint64_t> nvfs_reads_delta;
  std::optional<std::uint64_t> nvfs_bar1_map_delta;
  std::vector<std::string> new_dmesg_lines;  // nvidia-fs / NVRM / nvidia_p2p lines that appeared
  std::vector<sweep_point> sweep;
};

/// Options of a live probe.
struct probe_options {
  std::filesystem::path dir;              // where the test file goes (the --path folder)
  std::uint64_t file_bytes = 16u << 20;   // size of the test file
  std::vector<int> queue_depths{1, 4, 16};
};

/// Runs the live proof on this machine. Never throws; a missing library or GPU gives ran=false and a reason.
probe_results run_live_probe(const probe_options& options);

}  // namespace gdskit::doctor
