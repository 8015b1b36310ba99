// gdskit bench: gdsio-compatible workloads that report the data path that actually ran, latency percentiles,
// CPU cost, page-cache residency and a queue-depth scaling verdict. The CLI (apps/gdskit/cmd_bench.cpp) only
// forwards its arguments to run_command().
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
}

namespace gdskit::bench {

/// -I: gdsio's 0 read, 1 write, 2 randread, 3 randwrite.
enum class io_type { read = 0, write = 1, randread = 2, randwrite = 3 };
bool is_write(io_type t) noexcept;
bool is_random(io_type t) noexcept;
/// "READ", "WRITE", "RANDREAD", "RANDWRITE" (gdsio's IoType labels).
std::string_view io_label(io_type t) noexcept;

/// How the bytes move. gds/staged/compat: file_handle::read/write into GPU memory with that path mode.
/// host: pread/pwrite into host memory. naive: pread into malloc'd memory, then a synchronous copy to the GPU.
/// batch: GPU memory, each worker submitting -B ranges at a time to the batch core (which picks the route).
/// host_batch: the same into host memory.
enum class xfer_kind { gds, staged, compat, host, naive, batch, host_batch };
std::string_view to_string(xfer_kind k) noexcept;
bool needs_gpu(xfer_kind k) noexcept;
/// batch and host_batch: workers submit -B ranges at a time through the batch core.
bool is_batch(xfer_kind k) noexcept;

/// One -x value: what was asked (gdsio number or name) and what gdskit runs for it.
struct xfer_spec {
  xfer_kind kind = xfer_kind::host;
  int gdsio_number = 1;      ///< gdsio's 0..7, or -1 for a gdskit name with no gdsio number
  std::string label;         ///< XferType label printed in the gdsio line (GPUD, CPUONLY, ...)
  bool page_cache = false;   ///< gdsio 4 (CPU_CACHED_GPU): no O_DIRECT
  std::string note;          ///< what gdskit does differently from gdsio for this number (empty when the same)
  bool stream = false;       ///< gdsio 7 (GPU_BATCH_STREAM): each batch ordered on the worker's CUDA stream
};
/// Parses -x: "0".."7" or gds|staged|compat|host|naive|batch|batch-stream|host-batch. nullopt when unknown.
std::optional<xfer_spec> parse_xfer(std::string_view text);

/// -i: one size or min:max:step.
struct io_size_spec {
  std::uint64_t min_bytes = 1 << 20;
  std::uint64_t max_bytes = 1 << 20;
  std::uint64_t step_bytes = 0;  ///< 0 for a fixed size
  bool variable() const noexcept { return max_bytes != min_bytes; }
  /// "1024(KiB)" or "4-32-1(KiB)" like gdsio.
  std::string label() const;
};

/// One job: what gdsio calls a job (one line of its config file, or the command line).
struct job_spec {
  std::string name = "job0";
  /// A job file's section: messages name the job. A command-line job's messages name its flags instead.
  bool from_job_file = false;
  /// What set the io size, for a command-line job's messages: "-i", "--sweep io", or empty for the default.
  std::string io_flag;
  /// What set the worker count, for a command-line job's messages: "-w" or "--sweep threads".
  std::string threads_flag = "-w";
  std::filesystem::path file;       ///< -f (shared by the workers, each on its own region)
  std::filesystem::path directory;  ///< -D (one file gdsio.<n> per worker)
  int gpu = 0;                      ///< -d
  bool gpu_given = false;
  unsigned threads = 1;             ///< -w: workers, each with one request in flight
  std::uint64_t size_bytes = 0;     ///< -s: bytes per worker (gdsio's meaning)
  io_size_spec io;                  ///< -i
  std::uint64_t offset_bytes = 0;   ///< -o
  io_type type = io_type::read;     ///< -I
  xfer_spec xfer;                   ///< -x (default host: CPUONLY)
  bool verify = false;              ///< -V
  double seconds = 0;               ///< -T (0: one pass over the data set)
  std::uint64_t seed = 0;           ///< -k
  bool no_direct = false;           ///< -O 1 (gdsio 12.2+): buffered I/O
  std::optional<int> numa_node;     ///< -n: workers run on this NUMA node's CPUs
  bool refill = false;              ///< -F: new pattern data in the buffer before every write
  unsigned batch = 0;               ///< -B: ranges per batch of the batch types (0: k_default_batch)
};

/// -B when a batch type is asked without it.
inline constexpr unsigned k_default_batch = 64;
/// The most ranges one -B batch may hold (the core itself has no limit; this bounds each worker's memory).
inline constexpr unsigned k_max_batch = 65536;
/// Ranges per batch of a job: its -B, or the default for batch types, or 1 for the others.
unsigned batch_ranges(const job_spec& j) noexcept;

/// Flags that are not per job.
struct run_options {
  bool cold = false;          ///< --cold: drop the files' pages before the run and check they are gone
  bool warm = false;          ///< --warm: read the files through the page cache before a read run
  bool json = false;          ///< --json
  bool csv = false;           ///< --csv
  bool quiet = false;         ///< --quiet: no progress line
  bool verbose = false;       ///< -v: every reason of the path, not the first
  /// --learn: start from the shapes earlier loads learned and remember the one the run converges to. Off, a
  /// benchmark neither reads nor writes learned profiles: it is reproducible and changes no later run.
  bool learn = false;
  /// --progress / --no-progress; unset: progress only when stderr is a terminal and the output is a table.
  std::optional<bool> progress;
  std::filesystem::path plot; ///< --plot FILE.png
  std::optional<double> plateau_gib_s;  ///< --plateau: host copy rate the sweep verdict compares against
};

/// --sweep threads=1,2,4[,io=1M,4M][,x=host,naive].
struct sweep_spec {
  std::vector<unsigned> threads;
  std::vector<std::uint64_t> io_bytes;
  std::vector<xfer_spec> xfers;
};
/// Throws usage_error on a bad spec.
sweep_spec parse_sweep(std::string_view text);

/// Everything the command line asked for.
struct request {
  std::vector<job_spec> jobs;    ///< one from flags, or the config file's jobs
  run_options options;
  std::optional<sweep_spec> sweep;
  std::filesystem::path config_file;
  bool help = false;
};

/// Bad flags or bad input found before anything was run or written (exit code 2).
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Registers bench's flags (gdsio's and gdskit's) on `cmd`, the CLI's `bench` subcommand or a parser of its own.
/// After `cmd` parsed, the returned function makes the request from what it found; it throws usage_error naming
/// the flag and the reason.
std::function<request()> add_flags(CLI::App& cmd);
/// Parses the arguments after `bench` with the same flags. Throws usage_error naming the flag and the reason.
request parse_args(const std::vector<std::string>& args);
/// Reads a gdsio-style job file ([global] and [jobN] sections, key=value). Throws usage_error.
std::vector<job_spec> parse_config(std::string_view text, const job_spec& defaults);
/// The end of the furthest byte the job touches (offset + size x workers sharing the file). Throws usage_error when
/// a sum or product passes 2^63 - 1 (the largest file offset).
std::uint64_t check_extent(const job_spec& job);
/// The CPUs of NUMA node `node` (/sys/devices/system/node/node<N>/cpulist); empty when there is no such node.
std::vector<int> numa_node_cpus(int node);
/// Checks a job against the machine before anything runs (files, folders, sizes, GPUs). Throws usage_error.
void validate(const job_spec& job);
/// The flag summary printed by `gdskit bench -h`.
std::string usage();

/// Byte at file offset `offset` of the seeded verification pattern (-V with -k seed).
std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t offset) noexcept;
/// Fills `dst` with the pattern bytes for [offset, offset + n).
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::byte* dst, std::size_t n) noexcept;
/// Index of the first byte of `data` that differs from the pattern at `offset`, or nullopt.
std::optional<std::size_t> check_pattern(std::uint64_t seed, std::uint64_t offset, const std::byte* data,
                                         std::size_t n) noexcept;

/// Fraction of the file's pages in the page cache (mmap + mincore); nullopt when it cannot be measured
/// (empty or missing file), `why` says why.
std::optional<double> page_cache_residency(const std::filesystem::path& file, std::string* why = nullptr);
/// posix_fadvise(DONTNEED) after fdatasync. Returns the error text, empty on success.
std::string drop_page_cache(const std::filesystem::path& file);
/// Reads the whole file through the page cache (for --warm); returns an error text, empty on success.
std::string fill_page_cache(const std::filesystem::path& file);

/// Latency percentiles in microseconds.
struct latency_stats {
  double avg_us = 0, p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};
/// Nearest-rank percentiles of per-operation latencies in nanoseconds (sorts `ns`).
latency_stats summarize_latency(std::vector<std::uint64_t>& ns);

/// The cuFile per-GPU path counters moved by a run (level-3 statistics, summed over GPUs): which path the
/// library really took. posix == total means compat (bounced through host memory).
struct cufile_counts {
  std::uint64_t reads = 0, p2p_reads = 0, nvfs_reads = 0, posix_reads = 0;
  std::uint64_t writes = 0, p2p_writes = 0, nvfs_writes = 0, posix_writes = 0;
  /// The counters are process-wide: true when other cuFile jobs ran at the same time and share them.
  bool shared = false;
};
/// "compat" (every counted read and write went through POSIX), "direct" (none did, some went P2P/nvfs),
/// "mixed", or "none" (nothing counted).
std::string_view cufile_path_of(const cufile_counts& c) noexcept;
/// One line: the counts and what they mean.
std::string describe_cufile_counts(const cufile_counts& c);

/// What one job measured.
/// What the batch core did with a batch job's ranges, summed over its batches.
struct batch_route_counts {
  std::uint64_t host = 0, staged = 0, gds = 0;  ///< ranges moved by each route
  std::uint64_t requests = 0;                   ///< file requests issued
  std::uint64_t buffered = 0;                   ///< of them, through the page cache (not O_DIRECT)
  std::uint64_t batches = 0;
};

struct job_result {
  job_spec job;
  std::string path_ran;                 ///< data path that actually ran ("host", "staged", ...)
  std::vector<std::string> reasons;     ///< why that path (planner's reasons, O_DIRECT, engine)
  std::uint64_t bytes = 0;              ///< bytes transferred
  std::uint64_t requested_bytes = 0;    ///< size x threads (gdsio's second DataSetSize number)
  std::uint64_t ops = 0;
  double seconds = 0;                   ///< wall time of the I/O phase
  latency_stats latency;
  double cpu_user_s = 0, cpu_sys_s = 0; ///< process CPU time during the I/O phase
  std::optional<double> residency_before, residency_after;  ///< page-cache fraction (first file)
  std::string residency_note;           ///< why residency is missing, when it is
  bool cold_asked = false;
  bool warm_asked = false;
  std::string warm_error;  ///< why --warm could not read a file through the page cache
  std::optional<double> residency_after_drop;  ///< measured right after DONTNEED
  std::string drop_error;
  std::vector<std::filesystem::path> created;  ///< files this run created
  bool verified = false;                ///< -V ran
  bool verify_ok = true;
  std::uint64_t verified_bytes = 0;
  std::string verify_message;           ///< where the first mismatch was
  std::string cufile_stats;             ///< cuFile statistics delta in words, or why there is none
  std::optional<cufile_counts> cufile_counters;  ///< the delta itself, when cuFile statistics were readable
  /// Batch types: the routes the core took (ranges per route, file requests after coalescing).
  std::optional<batch_route_counts> routes;
  double gib_per_s() const noexcept;
  double cpu_s_per_gib() const noexcept;
};

/// Seams for tests: called between phases of a job.
struct hooks {
  /// After the write phase and before its verification read-back (plant a corruption here).
  std::function<void(const job_spec&, const std::vector<std::filesystem::path>& files)> after_write;
  /// Progress: bytes so far and seconds so far, called about twice a second from a watcher thread.
  std::function<void(std::uint64_t bytes, double seconds)> progress;
  /// Before worker thread `index` is started (throw std::system_error here to act out a failed start).
  std::function<void(std::size_t index)> before_thread;
};

/// Runs the jobs concurrently (all workers start together) and returns one result per job.
/// Throws usage_error for bad input found before the run, gdskit::error for I/O failures.
std::vector<job_result> run_jobs(const std::vector<job_spec>& jobs, const run_options& options,
                                 const hooks& h = {});

/// The aggregate of concurrent jobs: bytes and ops summed, the longest wall time.
job_result total_of(const std::vector<job_result>& results);

/// One point of a scaling curve.
struct curve_point {
  unsigned threads = 0;
  double gib_per_s = 0;
};
enum class verdict_kind { direct, not_direct, inconclusive, too_few_points };
struct scaling_verdict {
  verdict_kind kind = verdict_kind::too_few_points;
  double peak_gib_s = 0;
  std::string text;
};
/// The queue-depth verdict, a pure function of the curve (any order; sorted by threads inside) and the
/// staged-copy plateau (the host copy rate) when one is known. Rules: docs/bench.md.
scaling_verdict judge_scaling(std::vector<curve_point> curve, std::optional<double> plateau_gib_s);

/// Reporters.
/// gdsio's result line: "IoType: READ XferType: CPUONLY Threads: 4 DataSetSize: .../...(KiB) IOSize: ..."
std::string gdsio_line(const job_result& r);
/// gdskit's fields after the gdsio line (indented "key: value" lines); the path with its first reason, or with
/// `verbose` every reason.
std::string detail_lines(const job_result& r, bool verbose = false);
/// Stable JSON for one result (keys: tests/fixtures/bench/result_keys.txt).
nlohmann::json to_json(const job_result& r);
std::string csv_header();
std::string csv_row(const job_result& r);

/// One point of a sweep and its result.
struct sweep_row {
  std::string xfer;     ///< path name of the curve
  std::uint64_t io_bytes = 0;
  job_result result;
};
/// The sweep table (one line per point).
std::string sweep_table(const std::vector<sweep_row>& rows);
/// Verdict lines, one per (xfer, io) curve; the plateau is `plateau` or the best staged/naive curve.
std::string sweep_verdicts(const std::vector<sweep_row>& rows, std::optional<double> plateau);
/// Draws throughput against threads, one line per (xfer, io) curve, with gnuplot. Returns the error text,
/// empty on success.
std::string plot_sweep(const std::vector<sweep_row>& rows, const std::filesystem::path& png);
/// Why --plot PNG cannot work here (gnuplot missing from PATH, the folder missing), or empty: checked before a
/// sweep runs, so a long sweep does not end in an error.
std::string plot_precheck(const std::filesystem::path& png);

/// A bad GDSKIT_* setting is bad input, refused before anything runs: writes "<command>: <why>" to `err` and returns
/// true when the settings cannot be read.
bool settings_refused(std::ostream& err, std::string_view command);

/// `gdskit bench ARGS`: parses, runs and reports. Returns the exit code: 0 success, 1 verification failed,
/// 2 usage or bad input (nothing run), 3 I/O error during the run.
int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, const hooks& h = {});
/// The same for a request that `make_request` makes (add_flags' function): its usage_error is exit code 2.
int run_command(const std::function<request()>& make_request, std::ostream& out, std::ostream& err,
                const hooks& h = {});

}  // namespace gdskit::bench
