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

  // Further evidence (rendered in the probe layer).
  std::optional<io_path_counts> strict_stats_delta;  // the counters under allow_compat_mode=false
  std::string file_device;       // "maj:min" of the test file's device (names /run/udev/data/b<maj>:<min>)
  bool o_direct = false;         // the test file was opened with O_DIRECT
  std::string strict_config;     // where the private strict cufile.json came from
  std::vector<std::string> cufile_log_lines;  // NOTICE/WARN/ERROR lines of the probe processes' cufile.log
  std::vector<std::string> notes;             // what could not be observed, and why
};

/// What one probe process (strict or default configuration) reports on stdout, as one line
/// "GDSKIT-PROBE-CHILD {json}".
struct child_report {
  std::string mode;  // "strict" or "default"
  probe_step cuda_init;
  probe_step driver_open;
  probe_step handle_register;
  probe_step buf_register;
  probe_step write;
  probe_step read;
  bool verified = false;
  bool o_direct = false;
  std::string file_device;
  std::optional<io_path_counts> stats;  // delta over the write + read (not the sweep)
  std::vector<sweep_point> sweep;
  std::vector<std::string> notes;
};

inline constexpr const char* kChildMarker = "GDSKIT-PROBE-CHILD ";

/// The child's line (marker + compact JSON).
std::string child_report_line(const child_report& c);
/// Finds the last marker line in a child's stdout and decodes it; nullopt with `why` when absent or malformed.
std::optional<child_report> parse_child_report(const std::string& stdout_text, std::string* why = nullptr);

/// The probe process itself: drives cuFile on `file` (created, then removed) under whatever configuration the
/// environment selects, and reports. Never throws. `queue_depths` empty: no sweep.
child_report run_probe_child(const std::string& mode, const std::filesystem::path& file, std::uint64_t bytes,
                             const std::vector<int>& queue_depths);

/// How a probe process ended.
struct child_outcome {
  std::optional<child_report> report;
  std::string failure;  // why there is no report: "killed by signal 11 (Segmentation fault)", "timed out", ...
  std::string stderr_tail;
  std::string note;  // a complete report came, but the process then ended abnormally (at exit)
};
/// Starts `exe doctor --probe-child MODE --probe-file FILE [--probe-bytes N] [--probe-qd LIST]` with stdin on
/// /dev/null and `env` (NAME=VALUE entries, replacing same-named ones of this process), waits up to
/// `timeout_s` and decodes its report.
child_outcome spawn_probe_child(const std::filesystem::path& exe, const std::string& mode,
                                const std::filesystem::path& file, std::uint64_t bytes,
                                const std::vector<int>& queue_depths, const std::vector<std::string>& env,
                                const std::filesystem::path& scratch_dir, int timeout_s);

/// nvidia-fs /proc stats counters: `Reads : n=` (only with rw_stats_enabled=1) and `Bar1-map : n=`.
struct nvfs_counters {
  std::optional<std::uint64_t> reads;
  std::optional<std::uint64_t> bar1_maps;
};
nvfs_counters parse_nvfs_stats(const std::string& text);

/// dmesg lines of `after` not in `before` that concern GDS (nvidia-fs, NVRM, nvidia_p2p, p2pdma).
std::vector<std::string> new_gds_dmesg_lines(const std::string& before, const std::string& after);

/// The strict configuration: `system_json` (the effective cufile.json text, may be empty) with
/// allow_compat_mode set to false, or a minimal document carrying use_pci_p2pdma over when the key is absent.
std::string strict_cufile_json(const std::string& system_json);

/// Options of a live probe.
struct probe_options {
  std::filesystem::path dir;              // where the test file goes (the --path folder)
  std::uint64_t file_bytes = 16u << 20;   // size of the test file
  std::vector<int> queue_depths{1, 2, 4};
  std::filesystem::path self_exe = "/proc/self/exe";  // the gdskit binary, re-run for each probe process
  int timeout_s = 120;                                 // per probe process
};

/// Runs the live proof on this machine. Never throws; a missing library or GPU gives ran=false and a reason.
probe_results run_live_probe(const probe_options& options);

}  // namespace gdskit::doctor
