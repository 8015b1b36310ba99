// Flags, -x mapping, config files and the checks made before anything runs.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench/bench.hpp"
#include "bench/transfer.hpp"
#include "gdskit/settings.hpp"
#include "posix/bounded_read.hpp"
#include "posix/syscalls.hpp"
#include "tools/flag_errors.hpp"

namespace gdskit::bench {

bool is_write(io_type t) noexcept { return t == io_type::write || t == io_type::randwrite; }
bool is_random(io_type t) noexcept { return t == io_type::randread || t == io_type::randwrite; }

std::string_view io_label(io_type t) noexcept {
  switch (t) {
    case io_type::read: return "READ";
    case io_type::write: return "WRITE";
    case io_type::randread: return "RANDREAD";
    default: return "RANDWRITE";
  }
}

std::string_view to_string(xfer_kind k) noexcept {
  switch (k) {
    case xfer_kind::gds: return "gds";
    case xfer_kind::staged: return "staged";
    case xfer_kind::compat: return "compat";
    case xfer_kind::host: return "host";
    case xfer_kind::batch: return "batch";
    case xfer_kind::host_batch: return "host-batch";
    default: return "naive";
  }
}

bool needs_gpu(xfer_kind k) noexcept { return k != xfer_kind::host && k != xfer_kind::host_batch; }
bool is_batch(xfer_kind k) noexcept { return k == xfer_kind::batch || k == xfer_kind::host_batch; }

unsigned batch_ranges(const job_spec& j) noexcept {
  if (!is_batch(j.xfer.kind)) return 1;
  return j.batch == 0 ? k_default_batch : j.batch;
}

std::optional<xfer_spec> parse_xfer(std::string_view text) {
  // gdsio's numbers, mapped to the gdskit path with the same data movement (docs/bench.md has the table).
  static const xfer_spec by_number[] = {
      {xfer_kind::gds, 0, "GPUD", false, ""},
      {xfer_kind::host, 1, "CPUONLY", false, ""},
      {xfer_kind::naive, 2, "CPU_GPU", false, "gdskit copies synchronously on one stream per worker"},
      {xfer_kind::staged, 3, "CPU_ASYNC_GPU", false, "gdskit's staged pipeline (pinned slots, async copies)"},
      {xfer_kind::naive, 4, "CPU_CACHED_GPU", true, "naive without O_DIRECT (through the page cache)"},
      {xfer_kind::gds, 5, "GPUD_ASYNC", false, "run as gds: gdskit does not use the cuFile stream API"},
      {xfer_kind::batch, 6, "GPU_BATCH", false, "gdskit's batch core: it picks the route per range (cuFile's batch API only where true GDS works)"},
      {xfer_kind::batch, 7, "GPU_BATCH_STREAM", false, "gdskit's batch core, each batch ordered on the worker's CUDA stream", true},
  };
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '7') return by_number[text[0] - '0'];
  if (text == "gds") return xfer_spec{xfer_kind::gds, -1, "GPUD", false, ""};
  if (text == "staged") return xfer_spec{xfer_kind::staged, -1, "STAGED", false, ""};
  if (text == "compat") return xfer_spec{xfer_kind::compat, -1, "COMPAT", false, ""};
  if (text == "host") return xfer_spec{xfer_kind::host, -1, "CPUONLY", false, ""};
  if (text == "naive") return xfer_spec{xfer_kind::naive, -1, "CPU_GPU", false, ""};
  if (text == "batch") return xfer_spec{xfer_kind::batch, -1, "GPU_BATCH", false, ""};
  if (text == "batch-stream") return xfer_spec{xfer_kind::batch, -1, "GPU_BATCH_STREAM", false, "", true};
  if (text == "host-batch") return xfer_spec{xfer_kind::host_batch, -1, "CPU_BATCH", false, ""};
  return std::nullopt;
}

std::string io_size_spec::label() const {
  if (!variable()) return fmt::format("{}(KiB)", min_bytes / 1024);
  return fmt::format("{}-{}-{}(KiB)", min_bytes / 1024, max_bytes / 1024, step_bytes / 1024);
}

// NUMA node N's CPUs from /sys/devices/system/node/nodeN/cpulist ("0-3,8-11"); empty when the node does not exist.
std::vector<int> numa_node_cpus(int node) {
  std::ifstream in(fmt::format("/sys/devices/system/node/node{}/cpulist", node));
  std::string list;
  if (!in || !std::getline(in, list)) return {};
  std::vector<int> cpus;
  std::istringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    int lo = 0, hi = 0;
    auto dash = item.find('-');
    if (std::from_chars(item.data(), item.data() + (dash == std::string::npos ? item.size() : dash), lo).ec != std::errc())
      continue;
    hi = lo;
    if (dash != std::string::npos) std::from_chars(item.data() + dash + 1, item.data() + item.size(), hi);
    for (int c = lo; c <= hi && c < 65536; ++c) cpus.push_back(c);
  }
  return cpus;
}

namespace {

[[noreturn]] void fail(const std::string& msg) { throw usage_error(msg); }

// File offsets and sizes are off_t: nothing past 2^63 - 1 can be read or written.
constexpr std::uint64_t kMaxFileBytes = static_cast<std::uint64_t>(INT64_MAX);

std::uint64_t size_arg(std::string_view flag, std::string_view text) {
  auto v = parse_size(text);
  if (!v) fail(fmt::format("{} {}: not a size (use 4096, 4K, 1M, 1G)", flag, text));
  if (*v > kMaxFileBytes) fail(fmt::format("{} {}: larger than the largest file offset (2^63 - 1 bytes)", flag, text));
  return *v;
}

// -s, size=: the bytes of each worker, at least one (a run of nothing measures nothing).
std::uint64_t worker_size_arg(std::string_view flag, std::string_view text) {
  const std::uint64_t v = size_arg(flag, text);
  if (v == 0) fail(fmt::format("{} {}: the size per worker must be at least 1 byte", flag, text));
  return v;
}

// a * b + c, or nullopt when the result passes 2^63 - 1.
std::optional<std::uint64_t> checked_extent(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  if (b != 0 && a > kMaxFileBytes / b) return std::nullopt;
  const std::uint64_t ab = a * b;
  if (c > kMaxFileBytes - ab) return std::nullopt;
  return ab + c;
}

long long int_arg(std::string_view flag, std::string_view text, long long lo, long long hi) {
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) fail(fmt::format("{} {}: must be between {} and {}", flag, text, lo, hi));
  if (ec != std::errc() || p != text.data() + text.size()) fail(fmt::format("{} {}: not a whole number", flag, text));
  if (v < lo || v > hi) fail(fmt::format("{} {}: must be between {} and {}", flag, text, lo, hi));
  return v;
}

double seconds_arg(std::string_view flag, std::string_view text) {
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(std::string(text), &used);
    if (used != text.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    fail(fmt::format("{} {}: not a number of seconds", flag, text));
  }
  // stod takes "nan" and "inf"; neither is a duration, and NaN slips through every comparison.
  if (!std::isfinite(v) || v < 0 || v > 86400) fail(fmt::format("{} {}: must be between 0 and 86400 seconds", flag, text));
  return v;
}

io_size_spec io_arg(std::string_view flag, std::string_view text) {
  io_size_spec s;
  auto c1 = text.find(':');
  if (c1 == std::string_view::npos) {
    s.min_bytes = s.max_bytes = size_arg(flag, text);
    s.step_bytes = 0;
  } else {
    auto c2 = text.find(':', c1 + 1);
    if (c2 == std::string_view::npos) fail(fmt::format("{} {}: a range is min:max:step", flag, text));
    s.min_bytes = size_arg(flag, text.substr(0, c1));
    s.max_bytes = size_arg(flag, text.substr(c1 + 1, c2 - c1 - 1));
    s.step_bytes = size_arg(flag, text.substr(c2 + 1));
    if (s.max_bytes < s.min_bytes) fail(fmt::format("{} {}: max is smaller than min", flag, text));
    if (s.step_bytes == 0 && s.max_bytes != s.min_bytes) fail(fmt::format("{} {}: step must not be 0", flag, text));
  }
  if (s.min_bytes == 0) fail(fmt::format("{} {}: io size must be at least 1 byte", flag, text));
  if (s.max_bytes > (std::uint64_t{1} << 30)) fail(fmt::format("{} {}: io size above 1 GiB", flag, text));
  return s;
}

io_type io_type_arg(std::string_view flag, std::string_view text) {
  if (text == "read") return io_type::read;
  if (text == "write") return io_type::write;
  if (text == "randread") return io_type::randread;
  if (text == "randwrite") return io_type::randwrite;
  return static_cast<io_type>(int_arg(flag, text, 0, 3));
}

xfer_spec xfer_arg(std::string_view flag, std::string_view text) {
  auto x = parse_xfer(text);
  if (!x) {
    fail(fmt::format("{} {}: unknown transfer type (0-7, or gds, staged, compat, host, naive, batch, batch-stream, "
                     "host-batch)", flag, text));
  }
  return *x;
}

bool bool_arg(std::string_view flag, std::string_view text) {
  if (text == "1" || text == "true" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "no") return false;
  fail(fmt::format("{} {}: expected 0 or 1", flag, text));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// One gdsio setting: its flag letter (0: no flag), its job-file key, whether the flag takes a value, and its help.
struct setting_spec {
  char flag;
  std::string_view key;
  bool takes_value;
  std::string_view help;
  std::string_view value_name = "";
};

// gdsio's flags and job-file keys: one table, so that a flag and its key always accept the same values.
constexpr setting_spec kSettings[] = {
    {'f', "filename", true, "one file; worker n works on [-o + n*SIZE, -o + (n+1)*SIZE)", "FILE"},
    {'D', "directory", true, "one file DIR/gdsio.<n> per worker", "DIR"},
    {'d', "gpu_dev_id", true, "GPU index (GPU transfer types)", "GPU"},
    {'n', "numa_node", true, "run the workers on this NUMA node's CPUs", "NODE"},
    {'m', "mem_type", true, "0: GPU memory from cuMemAlloc (gdsio's cudaMalloc); 1-4 are refused with the reason", "0-4"},
    {'w', "num_threads", true, "workers, each with one IO_SIZE request in flight (queue depth) [1]", "THREADS"},
    {'s', "size", true, "bytes per worker (K, M, G: binary units)", "SIZE"},
    {'i', "bs", true, "request size, or min:max:step (random size in that range per request) [1M]", "IO_SIZE"},
    {'o', "start_offset", true, "start offset in the file [0]", "OFFSET"},
    {'I', "rw", true, "0|1|2|3: read, write, randread, randwrite (random offsets 4 KiB aligned) [0]", "0|1|2|3"},
    {'x', "xfer_type", true,
     "0 GPUD->gds, 1 CPUONLY->host, 2 CPU_GPU->naive, 3 CPU_ASYNC_GPU->staged, 4 CPU_CACHED_GPU->naive via page "
     "cache, 5->gds, 6 GPU_BATCH->batch, 7 GPU_BATCH_STREAM->batch-stream; or a name: gds, staged, compat, host, "
     "naive, batch, batch-stream, host-batch (batch types: -B ranges per batch from each worker) [host]", "TYPE"},
    {'V', "do_verify", false, "verify: writes a seeded pattern and checks every byte read back"},
    {'T', "runtime", true, "run for this long (seconds), re-reading or re-writing the data set", "SECONDS"},
    {'k', "random_seed", true, "seed for random offsets, sizes and the verify pattern [0]", "SEED"},
    {'O', "fd_mode", true, "0 O_DIRECT where the file system allows it, 1 page cache [0]", "0|1"},
    {'b', "skip_bufregister", false, "do not register buffers with cuFile (gdskit bench never does)"},
    {'R', "fill_random", false, "fill buffers with random data (gdskit always writes a seeded pseudo-random pattern)"},
    {'F', "refill_buffer", false, "refill the buffer with new pattern data before every write"},
    {'p', "enable_nvlinks", false, "refused: gdskit has no NVLink path"},
    {'U', "unaligned", false, "refused: random offsets are 4 KiB aligned"},
    {'a', "alignment_size", true, "refused: random offsets are 4 KiB aligned", "SIZE"},
    {'B', "batch_size", true, "ranges per batch of the batch types (-x 6, 7, batch, host-batch), all in flight "
     "together; each worker waits for its batch, then submits the next [64]", "N"},
    {'M', "", true, "refused: a job reads or writes; run a read job and a write job together from a config file", "PERCENT"},
    {'P', "", true, "refused: gdskit bench has no RDMA transfer", "URL"},
    {'J', "", false, "per-job statistics (gdskit always reports each job)"},
    {0, "name", true, ""},
};

// Applies one setting to a job; `label` names it in messages ("-s", "line 3: size=").
void apply_setting(job_spec& j, std::string_view key, const std::string& label, std::string_view value) {
  if (key == "name") j.name = value;
  else if (key == "xfer_type") j.xfer = xfer_arg(label, value);
  else if (key == "rw") j.type = io_type_arg(label, value);
  else if (key == "bs") j.io = io_arg(label, value);
  else if (key == "size") j.size_bytes = worker_size_arg(label, value);
  else if (key == "runtime") j.seconds = seconds_arg(label, value);
  else if (key == "do_verify") j.verify = bool_arg(label, value);
  else if (key == "random_seed") j.seed = static_cast<std::uint64_t>(int_arg(label, value, 0, INT64_MAX));
  else if (key == "start_offset") j.offset_bytes = size_arg(label, value);
  else if (key == "gpu_dev_id") { j.gpu = static_cast<int>(int_arg(label, value, 0, 1023)); j.gpu_given = true; }
  else if (key == "num_threads") j.threads = static_cast<unsigned>(int_arg(label, value, 1, 1024));
  else if (key == "directory") j.directory = std::string(value);
  else if (key == "filename") j.file = std::string(value);
  else if (key == "fd_mode") j.no_direct = bool_arg(label, value);
  else if (key == "numa_node") j.numa_node = static_cast<int>(int_arg(label, value, 0, 1023));
  else if (key == "skip_bufregister") (void)bool_arg(label, value);  // gdskit bench never registers its buffers
  else if (key == "fill_random") (void)bool_arg(label, value);       // the pattern is pseudo-random already
  else if (key == "refill_buffer") j.refill = bool_arg(label, value);
  else if (key == "mem_type") {
    switch (int_arg(label, value, 0, 4)) {
      case 0: break;
      case 1: fail(fmt::format("{} 1 (cuMem): gdskit bench allocates GPU memory with cuMemAlloc only (0)", label));
      default:
        fail(fmt::format("{} {} (host memory through cuFile): not a gdskit bench transfer; -x host moves host "
                         "memory with pread/pwrite", label, value));
    }
  } else if (key == "enable_nvlinks") {
    if (bool_arg(label, value)) fail(fmt::format("{}: gdskit has no NVLink path (gdsio uses it for peer-GPU buffers)", label));
  } else if (key == "unaligned") {
    if (bool_arg(label, value)) fail(fmt::format("{}: gdskit bench's random offsets are 4 KiB aligned (O_DIRECT)", label));
  } else if (key == "alignment_size") {
    fail(fmt::format("{} {}: gdskit bench's random offsets are 4 KiB aligned (O_DIRECT)", label, value));
  } else if (key == "batch_size") {
    j.batch = static_cast<unsigned>(int_arg(label, value, 1, k_max_batch));
  } else {
    fail(fmt::format("{}: unknown key", label));
  }
}

// The flags with no job-file key.
void apply_flag_only(char flag, std::string_view value) {
  switch (flag) {
    case 'M':
      fail(fmt::format("-M {}: a gdskit bench job reads or writes; for a mix, run a read job and a write job "
                       "together from a config file (gdskit bench CONFIG)", value));
    case 'P': fail(fmt::format("-P {}: gdskit bench has no RDMA transfer", value));
    default: break;  // -J: every job is reported on its own already
  }
}

}  // namespace

std::vector<job_spec> parse_config(std::string_view text, const job_spec& defaults) {
  job_spec global = defaults;
  std::vector<job_spec> jobs;
  std::string section;
  int lineno = 0;
  std::istringstream in{std::string(text)};
  std::string raw;
  while (std::getline(in, raw)) {
    ++lineno;
    // A NUL would silently cut a file name short when it reaches open(2).
    if (raw.find('\0') != std::string::npos) fail(fmt::format("line {}: contains a NUL byte", lineno));
    std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    const std::string where = fmt::format("line {}:", lineno);
    if (line.front() == '[') {
      if (line.back() != ']') fail(where + " section header without ']'");
      section = std::string(trim(line.substr(1, line.size() - 2)));
      if (section.empty()) fail(where + " empty section name");
      if (section != "global") {
        jobs.push_back(global);
        jobs.back().name = section;
        jobs.back().from_job_file = true;
      }
      continue;
    }
    auto eq = line.find('=');
    if (eq == std::string_view::npos) fail(where + " expected key=value");
    auto key = trim(line.substr(0, eq));
    auto value = trim(line.substr(eq + 1));
    if (section.empty()) fail(where + " key outside a section");
    const std::string label = fmt::format("{} {}=", where, key);
    if (section == "global") {
      if (!jobs.empty()) fail(where + " [global] must come before the jobs");
      apply_setting(global, key, label, value);
    } else {
      apply_setting(jobs.back(), key, label, value);
    }
  }
  if (jobs.empty()) fail("config file has no job sections ([job1], ...)");
  return jobs;
}

sweep_spec parse_sweep(std::string_view text) {
  sweep_spec s;
  std::string key;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    auto comma = text.find_first_of(",;", pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq != std::string_view::npos) {
      key = std::string(trim(item.substr(0, eq)));
      item = trim(item.substr(eq + 1));
      if (key != "threads" && key != "io" && key != "x") {
        fail(fmt::format("--sweep: unknown key '{}' (threads, io, x)", key));
      }
    }
    if (key.empty()) fail(fmt::format("--sweep {}: start with threads=", text));
    if (key == "threads") s.threads.push_back(static_cast<unsigned>(int_arg("--sweep threads", item, 1, 1024)));
    else if (key == "io") s.io_bytes.push_back(io_arg("--sweep io", item).min_bytes);
    else s.xfers.push_back(xfer_arg("--sweep x", item));
  }
  if (s.threads.empty()) fail("--sweep: needs threads=1,2,4,...");
  return s;
}

namespace {

// What the flags left: one string per gdsio setting, and the gdskit flags.
struct flag_values {
  std::map<char, std::string> value;
  std::map<char, bool> on;
  std::map<char, CLI::Option*> opt;
  std::vector<std::string> positional;
  run_options options;
  std::string plot, sweep, plateau;
  bool progress = false, no_progress = false;
  CLI::Option *plot_opt = nullptr, *sweep_opt = nullptr, *plateau_opt = nullptr;
};

constexpr const char* kDescription =
    "gdsio-compatible benchmark that reports the data path that actually ran.\n\n"
    "  gdskit bench -f FILE|-D DIR -s SIZE [-w THREADS] [-i IO_SIZE] [-I 0|1|2|3] [-x TYPE] [options]\n"
    "  gdskit bench JOBFILE [options]   run the jobs of a gdsio-style job file concurrently";

request finish(const flag_values& v) {
  request r;
  r.options = v.options;
  if (v.progress && v.no_progress) fail("--progress and --no-progress: pick one");
  if (v.progress) r.options.progress = true;
  if (v.no_progress || r.options.quiet) r.options.progress = false;
  if (v.plot_opt->count()) {
    r.options.plot = v.plot;
    if (r.options.plot.extension() != ".png") fail(fmt::format("--plot {}: the file must end in .png", v.plot));
  }
  if (v.sweep_opt->count()) r.sweep = parse_sweep(v.sweep);
  if (v.plateau_opt->count()) {
    double g = seconds_arg("--plateau", v.plateau);
    if (g <= 0) fail("--plateau: must be above 0 GiB/s");
    r.options.plateau_gib_s = g;
  }
  job_spec job;
  job.xfer = *parse_xfer("host");
  bool job_flags = false;
  for (const auto& s : kSettings) {
    if (s.flag == 0 || v.opt.at(s.flag)->count() == 0) continue;
    job_flags = true;
    const std::string label = std::string("-") + s.flag;
    const std::string_view value = s.takes_value ? std::string_view(v.value.at(s.flag)) : std::string_view("1");
    if (s.key.empty()) apply_flag_only(s.flag, value);
    else apply_setting(job, s.key, label, value);
  }
  if (v.opt.at('i')->count()) job.io_flag = "-i";
  if (v.positional.size() > 1) fail(fmt::format("{}: only one job file", v.positional[1]));
  if (!v.positional.empty()) {
    r.config_file = v.positional.front();
    // A regular file of at most 1 MiB: a FIFO is never waited on, a device never read without end.
    constexpr std::size_t k_max_job_file = std::size_t{1} << 20;
    const bounded_text text = read_bounded(r.config_file, k_max_job_file + 1);
    if (!text.ok()) fail(fmt::format("job file {}: {}", r.config_file.string(), text.reason()));
    if (text.capped || text.text->size() > k_max_job_file) {
      fail(fmt::format("job file {}: larger than 1 MiB; a job file is a few lines of text", r.config_file.string()));
    }
    job_spec defaults;
    defaults.xfer = *parse_xfer("host");
    r.jobs = parse_config(*text.text, defaults);
    if (job_flags) fail("job file: give the job settings in the file, not as flags");
  } else {
    if (!job.file.empty() && !job.directory.empty()) fail("-f and -D: give one of them, not both");
    if (job.file.empty() && job.directory.empty()) fail("needs -f FILE or -D DIR (or a job file)");
    if (v.opt.at('s')->count() == 0) fail("needs -s SIZE");
    r.jobs.push_back(job);
  }
  for (const auto& j : r.jobs) {
    if (j.file.empty() == j.directory.empty()) fail(fmt::format("job {}: needs exactly one of filename or directory", j.name));
    if (j.size_bytes == 0) fail(fmt::format("job {}: needs size= (bytes per worker)", j.name));
    if (j.verify && j.seconds > 0) fail("-V cannot be combined with -T (like gdsio: a timed run re-writes the data set)");
    if (j.io.min_bytes == 0) fail("-i: io size must be at least 1 byte");
    check_extent(j);
  }
  if (r.sweep && r.jobs.size() > 1) fail("--sweep runs one job: use flags, not a job file");
  if (!r.options.plot.empty() && !r.sweep) fail("--plot needs --sweep (it draws throughput against threads)");
  if (r.options.json && r.options.csv) fail("--json and --csv: pick one");
  if (r.options.warm && r.options.cold) fail("--warm and --cold: pick one");
  if (r.options.warm) {
    for (const auto& j : r.jobs) {
      if (is_write(j.type)) fail("--warm fills the page cache for reads; a write run (-I 1|3) has nothing to warm");
    }
  }
  return r;
}

}  // namespace

std::function<request()> add_flags(CLI::App& cmd) {
  auto v = std::make_shared<flag_values>();
  for (const auto& s : kSettings) {
    if (s.flag == 0) continue;
    const std::string name = std::string("-") + s.flag;
    CLI::Option* o = s.takes_value ? cmd.add_option(name, v->value[s.flag], std::string(s.help))
                                         ->type_name(std::string(s.value_name))
                                   : cmd.add_flag(name, v->on[s.flag], std::string(s.help));
    o->group("gdsio flags");
    v->opt[s.flag] = o;
  }
  const char* g = "gdskit flags";
  cmd.add_flag("--cold", v->options.cold, "drop the files from the page cache first (posix_fadvise DONTNEED), checked with mincore")->group(g);
  cmd.add_flag("--warm", v->options.warm, "read the files through the page cache first (reads only): measures cached data")->group(g);
  v->sweep_opt = cmd.add_option("--sweep", v->sweep, "threads=1,2,4,8,16[,io=1M,4M][,x=host,naive]: run the matrix, print a table and a scaling verdict")->type_name("SPEC")->group(g);
  v->plateau_opt = cmd.add_option("--plateau", v->plateau, "host copy rate the verdict compares against (default: the best staged/naive curve)")->type_name("GIB_S")->group(g);
  cmd.add_flag("--json", v->options.json, "one JSON document on stdout")->group(g);
  cmd.add_flag("--csv", v->options.csv, "CSV on stdout")->group(g);
  v->plot_opt = cmd.add_option("--plot", v->plot, "throughput against threads per path (gnuplot)")->type_name("FILE.png")->group(g);
  cmd.add_flag("--progress", v->progress, "progress on stderr even when it is not a terminal")->group(g);
  cmd.add_flag("--no-progress", v->no_progress, "no progress (the default when stderr is not a terminal, or with --json/--csv)")->group(g);
  cmd.add_flag("-q,--quiet", v->options.quiet, "no progress")->group(g);
  cmd.add_flag("-v,--verbose", v->options.verbose, "every reason of the path (the path line names the first)")->group(g);
  cmd.add_flag("--learn", v->options.learn, "start from the shapes earlier loads learned and remember the one this run "
               "converges to (off: a benchmark is reproducible and changes no later run)")->group(g);
  cmd.add_option("jobfile", v->positional, "gdsio-style job file ([global] and [jobN] sections)")->type_name("JOBFILE");
  return [v] { return finish(*v); };
}

std::string usage() {
  CLI::App app{kDescription, "gdskit bench"};
  (void)add_flags(app);
  return app.help();
}

request parse_args(const std::vector<std::string>& args) {
  CLI::App app{kDescription, "gdskit bench"};
  auto finish_parse = add_flags(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    request r;
    r.help = true;
    return r;
  } catch (const CLI::ParseError& e) {
    fail(tools::usage_message(app, e));
  }
  return finish_parse();
}

namespace {

bool folder_writable(const std::filesystem::path& dir, std::string* why) {
  std::error_code ec;
  auto st = std::filesystem::status(dir, ec);
  if (ec || !std::filesystem::exists(st)) {
    *why = fmt::format("folder {} does not exist", dir.string());
    return false;
  }
  if (!std::filesystem::is_directory(st)) {
    *why = fmt::format("{} is not a folder", dir.string());
    return false;
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    *why = fmt::format("folder {} is not writable: {}", dir.string(), std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace

std::uint64_t check_extent(const job_spec& j) {
  // -f: the workers share one file, one region each; -D: one region per file.
  const std::uint64_t regions = j.file.empty() ? 1 : j.threads;
  auto end = checked_extent(j.size_bytes, regions, j.offset_bytes);
  auto total = checked_extent(j.size_bytes, j.threads, 0);
  if (!end || !total) {
    if (j.from_job_file) {
      fail(fmt::format("job {}: offset {} + {} x {} bytes passes the largest file offset (2^63 - 1 bytes); "
                       "lower size=, num_threads= or start_offset=", j.name, j.offset_bytes, regions, j.size_bytes));
    }
    fail(fmt::format("-s {} x {} {} from -o {} passes the largest file offset (2^63 - 1 bytes); lower -s, {} or -o",
                     j.size_bytes, j.threads_flag, j.threads, j.offset_bytes, j.threads_flag));
  }
  return *end;
}

void validate(const job_spec& j) {
  const bool writing = is_write(j.type);
  // A job file's job is named; a command-line job is not (it has no name the user gave): its flags are.
  const std::string who = j.from_job_file ? fmt::format("job {}: ", j.name) : std::string();
  if (j.io.max_bytes > j.size_bytes) {
    const std::string io = format_size(j.io.max_bytes), size = format_size(j.size_bytes);
    const std::string_view up_to = j.io.variable() ? "up to " : "";
    if (j.from_job_file) {
      fail(fmt::format("{}io size {}{} is larger than the size per worker {}", who, up_to, io, size));
    }
    if (j.io_flag.empty()) {
      fail(fmt::format("-s {}: smaller than one request of the default io size {}; raise -s or give a smaller -i",
                       size, io));
    }
    fail(fmt::format("{} {}{}: larger than -s {}, the size per worker; lower {} or raise -s", j.io_flag, up_to, io,
                     size, j.io_flag));
  }
  if (j.batch != 0 && !is_batch(j.xfer.kind)) {
    fail(fmt::format("-B {}: only the batch types take a batch size (-x 6, 7, batch, batch-stream, host-batch); "
                     "-x {} moves one request per worker at a time (-w sets the depth)", j.batch,
                     to_string(j.xfer.kind)));
  }
  if (is_batch(j.xfer.kind)) {
    const unsigned b = batch_ranges(j);
    // Each worker holds one IO_SIZE slot per range of its batch.
    const std::uint64_t mem = std::uint64_t{b} * j.io.max_bytes;
    if (mem > (std::uint64_t{16} << 30)) {
      if (j.from_job_file) {
        fail(fmt::format("{}batch_size {}{} x bs {} is {} of memory per worker (at most 16 GiB); lower batch_size= "
                         "or bs=", who, b, j.batch == 0 ? " (the default)" : "", format_size(j.io.max_bytes),
                         format_size(mem)));
      }
      fail(fmt::format("-B {}{} x io size {} is {} of memory per worker (at most 16 GiB); lower -B or -i", b,
                       j.batch == 0 ? " (the default)" : "", format_size(j.io.max_bytes), format_size(mem)));
    }
  }
  if (j.numa_node && numa_node_cpus(*j.numa_node).empty()) {
    fail(fmt::format("-n {}: no NUMA node {} with CPUs on this machine (/sys/devices/system/node)", *j.numa_node,
                     *j.numa_node));
  }
  if (needs_gpu(j.xfer.kind)) {
    std::string why;
    if (!gpu_usable(&why)) {
      // Named as it was asked: "-x 7 (batch-stream)", "-x staged".
      const std::string name(j.xfer.stream ? std::string_view("batch-stream") : to_string(j.xfer.kind));
      const std::string asked = j.xfer.gdsio_number >= 0 ? fmt::format("{} ({})", j.xfer.gdsio_number, name) : name;
      fail(fmt::format("-x {} needs a GPU, and none is usable: {}", asked, why));
    }
    int n = gpu_devices();
    if (j.gpu >= n) fail(fmt::format("-d {}: no such GPU (this machine has {}; indexes 0..{})", j.gpu, n, n - 1));
  }
  const std::uint64_t end = check_extent(j);
  std::vector<std::filesystem::path> files;
  std::vector<std::uint64_t> need;
  if (!j.file.empty()) {
    files.push_back(j.file);
    need.push_back(end);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(j.directory, ec)) fail(fmt::format("-D {}: not a folder", j.directory.string()));
    for (unsigned n = 0; n < j.threads; ++n) {
      files.push_back(j.directory / fmt::format("gdsio.{}", n));
      need.push_back(end);
    }
  }
  for (std::size_t k = 0; k < files.size(); ++k) {
    const auto& f = files[k];
    std::error_code ec;
    auto st = std::filesystem::status(f, ec);
    const bool exists = std::filesystem::exists(st);
    if (exists && std::filesystem::is_directory(st)) fail(fmt::format("{}: is a folder, not a file", f.string()));
    if (writing) {
      std::string why;
      auto parent = f.parent_path().empty() ? std::filesystem::path(".") : f.parent_path();
      if (exists) {
        if (::access(f.c_str(), W_OK) != 0) fail(fmt::format("{}: cannot write: {}", f.string(), std::strerror(errno)));
      } else if (!folder_writable(parent, &why)) {
        fail(fmt::format("{}: cannot create: {}", f.string(), why));
      }
      continue;
    }
    if (!exists) {
      fail(fmt::format("{}: no such file to read (write it first: -I 1{})", f.string(),
                       j.verify ? " -V with the same -k, -w, -o and -s" : ""));
    }
    if (::access(f.c_str(), R_OK) != 0) fail(fmt::format("{}: cannot read: {}", f.string(), std::strerror(errno)));
    // A block device (raw NVMe, as gdsio users benchmark it) has st_size 0: ask the device.
    std::uint64_t have = 0;
    {
      ec.clear();
      posix::unique_fd fd(posix::open_retry(f.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0, ec));
      if (fd) have = posix::size_of(fd.get(), ec);
      if (ec) fail(fmt::format("{}: cannot read its size: {}", f.string(), ec.message()));
    }
    if (have < need[k]) {
      fail(fmt::format("{}: the file has {} but the run reads {} (offset {} + {} x {} per worker); "
                       "lower -s or -w, or write the file first with -I 1",
                       f.string(), format_size(have), format_size(need[k]), format_size(j.offset_bytes),
                       j.file.empty() ? 1u : j.threads, format_size(j.size_bytes)));
    }
  }
}

}  // namespace gdskit::bench
