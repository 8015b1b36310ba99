// Runs jobs: workers with one request in flight each, timing every request, then verification.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "bench/bench.hpp"
#include "bench/transfer.hpp"
#include "tools/signal_cleanup.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"
#include "shim/cufile.hpp"

namespace gdskit::bench {

double job_result::gib_per_s() const noexcept {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / double(1 << 30) : 0.0;
}

double job_result::cpu_s_per_gib() const noexcept {
  return bytes > 0 ? (cpu_user_s + cpu_sys_s) / (static_cast<double>(bytes) / double(1 << 30)) : 0.0;
}

namespace {

using clock_type = std::chrono::steady_clock;

double tv_seconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; }

struct cpu_times {
  double user = 0, sys = 0;
};
cpu_times process_cpu() {
  rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return {tv_seconds(ru.ru_utime), tv_seconds(ru.ru_stime)};
}

bool uses_cufile(xfer_kind k) noexcept { return k == xfer_kind::gds || k == xfer_kind::compat; }

// Before a cuFile run: turn level-3 statistics on. Returns the note to show when they cannot be had, empty
// when the counters will be read around the timed phase.
std::string cufile_stats_note(xfer_kind k) {
  if (!uses_cufile(k)) return "not applicable (no cuFile I/O on this path)";
  std::string why;
  if (shim::cufile(&why) == nullptr) return "not available: " + why;
  // The driver is opened once per process (the transfer would open it at its first request), in the mode the
  // run asks for: the counters can only be read from an open driver, and the snapshot before the run must be
  // readable.
  if (const int st = shim::cufile_driver_open(k == xfer_kind::compat); st != shim::CU_FILE_SUCCESS)
    return fmt::format("not available: cuFileDriverOpen returned {} ({})", st, cufile_code(st).message());
  if (!shim::cufile_enable_stats())
    return "not available: this libcufile has no level-3 statistics (cuFileSetStatsLevel/cuFileGetStatsL3, cuFile 1.15+)";
  return {};
}

std::uint64_t minus(std::uint64_t after, std::uint64_t before) { return after >= before ? after - before : 0; }

cufile_counts delta(const shim::cufile_path_counters& a, const shim::cufile_path_counters& b) {
  cufile_counts d;
  d.reads = minus(b.reads, a.reads);
  d.p2p_reads = minus(b.p2p_reads, a.p2p_reads);
  d.nvfs_reads = minus(b.nvfs_reads, a.nvfs_reads);
  d.posix_reads = minus(b.posix_reads, a.posix_reads);
  d.writes = minus(b.writes, a.writes);
  d.p2p_writes = minus(b.p2p_writes, a.p2p_writes);
  d.nvfs_writes = minus(b.nvfs_writes, a.nvfs_writes);
  d.posix_writes = minus(b.posix_writes, a.posix_writes);
  return d;
}

struct worker {
  const job_spec* job = nullptr;
  const file_handle* file = nullptr;
  std::uint64_t begin = 0, length = 0;  // this worker's region
  std::unique_ptr<transfer> xfer;
  std::mt19937_64 rng;
  std::vector<std::uint64_t> latency_ns;
  std::vector<std::pair<std::uint64_t, std::size_t>> written;  // ranges to read back for -V writes
  std::atomic<std::uint64_t> bytes{0};
  std::uint64_t ops = 0;
  clock_type::time_point end;
  bool verify_ok = true;
  std::uint64_t verified = 0;
  std::string verify_message;
  batch_route_counts routes;  // batch types
};

std::size_t next_size(worker& w) {
  const io_size_spec& io = w.job->io;
  if (!io.variable()) return io.min_bytes;
  const std::uint64_t steps = (io.max_bytes - io.min_bytes) / io.step_bytes;
  return io.min_bytes + (w.rng() % (steps + 1)) * io.step_bytes;
}

// Checks the `n` bytes at byte `at` of the worker's buffer against the pattern at file offset `offset`.
void check(worker& w, std::uint64_t offset, std::size_t n, std::vector<std::byte>& scratch, std::size_t at = 0) {
  if (!w.verify_ok) return;
  w.xfer->store(scratch.data(), n, at);
  if (auto bad = check_pattern(w.job->seed, offset, scratch.data(), n)) {
    const std::uint64_t at = offset + *bad;
    w.verify_ok = false;
    w.verify_message = fmt::format("mismatch in {} at offset {}: expected 0x{:02x}, read 0x{:02x}",
                                   w.file->path().string(), at, pattern_byte(w.job->seed, at),
                                   static_cast<unsigned>(scratch[*bad]));
  } else {
    w.verified += n;
  }
}

// -n: the calling worker thread runs on the node's CPUs only.
void bind_to_node(const job_spec& j) {
  if (!j.numa_node) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : numa_node_cpus(*j.numa_node))
    if (c < CPU_SETSIZE) CPU_SET(c, &set);
  if (int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set); rc != 0)
    throw error(errno_code(rc), fmt::format("binding a worker to NUMA node {} (-n)", *j.numa_node));
}

// Before the timed phase: without -V the content written does not matter, so the buffer is filled once here
// and the timed loop measures I/O, not pattern generation or the copy that loads it.
void preload(worker& w) {
  const job_spec& j = *w.job;
  if (!is_write(j.type) || j.verify || j.refill) return;
  bind_to_node(j);  // the buffer's memory on the worker's node
  std::vector<std::byte> fill(w.xfer->memory().nbytes);
  fill_pattern(j.seed, 0, fill.data(), fill.size());
  w.xfer->load(fill.data(), fill.size());
}

// The next request's offset and size in the worker's region: random (4 KiB aligned) or the next bytes, going
// round again at the region's end.
std::pair<std::uint64_t, std::size_t> next_range(worker& w, std::uint64_t& pos) {
  const job_spec& j = *w.job;
  std::size_t n = next_size(w);
  if (is_random(j.type)) {
    const std::uint64_t slots = (w.length - n) / 4096 + 1;
    return {w.begin + (w.rng() % slots) * 4096, n};
  }
  const std::uint64_t region_end = w.begin + w.length;
  if (pos >= region_end) pos = w.begin;
  n = static_cast<std::size_t>(std::min<std::uint64_t>(n, region_end - pos));
  const std::uint64_t off = pos;
  pos += n;
  return {off, n};
}

void run_worker(worker& w, const std::atomic<bool>& stop, clock_type::time_point start) {
  const job_spec& j = *w.job;
  bind_to_node(j);
  const bool writing = is_write(j.type);
  const std::size_t cap = j.io.max_bytes;
  std::vector<std::byte> scratch(j.verify || j.refill ? cap : 0);
  const auto deadline = start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(j.seconds));
  std::uint64_t pos = w.begin, done_bytes = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    if (j.seconds > 0) {
      if (clock_type::now() >= deadline) break;
    } else if (done_bytes >= w.length) {
      break;
    }
    const auto [off, n] = next_range(w, pos);
    if (writing && (j.verify || j.refill)) {
      fill_pattern(j.seed, off, scratch.data(), n);
      w.xfer->load(scratch.data(), n);
    }
    auto t0 = clock_type::now();
    std::size_t got = writing ? w.xfer->write(*w.file, off, n) : w.xfer->read(*w.file, off, n);
    auto t1 = clock_type::now();
    w.latency_ns.push_back(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    if (got != n) {
      throw short_read_error(w.file->path().string(), static_cast<std::int64_t>(off), n, got);
    }
    ++w.ops;
    done_bytes += n;
    w.bytes.fetch_add(n, std::memory_order_relaxed);
    if (j.verify) {
      if (writing) w.written.emplace_back(off, n);
      else check(w, off, n, scratch);
    }
  }
  w.end = clock_type::now();
}

// Whether [off, off + n) overlaps a range of `taken` (start -> end, disjoint).
bool overlaps(const std::map<std::uint64_t, std::uint64_t>& taken, std::uint64_t off, std::size_t n) {
  auto it = taken.lower_bound(off + n);  // the first range starting at or after our end
  if (it == taken.begin()) return false;
  return std::prev(it)->second > off;
}

// The batch types: each worker submits -B ranges to the batch core at once (all in flight together), waits for
// the batch (through its CUDA stream for gdsio 7 reads), then submits the next. The latency of each range is
// the core's own: from its first file request to its completion.
void run_batch_worker(worker& w, const std::atomic<bool>& stop, clock_type::time_point start) {
  const job_spec& j = *w.job;
  bind_to_node(j);
  const bool writing = is_write(j.type);
  const std::size_t cap = j.io.max_bytes;
  const unsigned nb = batch_ranges(j);
  const buffer_view mem = w.xfer->memory();
  std::vector<std::byte> scratch(j.verify || j.refill ? cap : 0);
  const auto deadline = start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(j.seconds));
  std::uint64_t pos = w.begin, planned = 0;
  std::vector<io_range> ranges;
  ranges.reserve(nb);
  std::map<std::uint64_t, std::uint64_t> taken;  // the batch's file ranges: start -> end
  batch_options o;
  o.queue_depth = nb;
  o.exact = true;  // a short read is an error, as in the other types
  o.stream = w.xfer->stream();
  while (!stop.load(std::memory_order_relaxed)) {
    if (j.seconds > 0 ? clock_type::now() >= deadline : planned >= w.length) break;
    ranges.clear();
    taken.clear();
    for (unsigned k = 0; k < nb && (j.seconds > 0 || planned < w.length); ++k) {
      auto [off, n] = next_range(w, pos);
      // The ranges of one write batch must not overlap in the file (their order is not defined): a random
      // offset is drawn again a few times, and a batch that cannot get another distinct range goes as it is.
      // Reads draw the same way, so that a read run with the same -k replays a write run's ranges (-V).
      for (int tries = 0; tries < 8 && overlaps(taken, off, n) && is_random(j.type); ++tries) {
        std::tie(off, n) = next_range(w, pos);
      }
      if (overlaps(taken, off, n)) {
        if (!is_random(j.type)) pos -= n;  // the sequential cursor went round: this range starts the next batch
        break;
      }
      taken.emplace(off, off + n);
      planned += n;
      if (writing && (j.verify || j.refill)) {
        fill_pattern(j.seed, off, scratch.data(), n);
        w.xfer->load(scratch.data(), n, k * cap);
      }
      ranges.push_back({w.file, off, mem.sub(k * cap, n)});
    }
    batch_future fut = submit(writing ? io_direction::write : io_direction::read, ranges, o);
    if (o.stream != nullptr && !writing) w.xfer->sync_stream();  // the stream waits until the bytes landed
    const batch_result& r = fut.get();
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      const range_result& x = r.ranges[k];
      const std::size_t n = ranges[k].memory.nbytes;
      if (!x.ok()) {
        if (x.error == errno_code(ENODATA)) {
          throw short_read_error(w.file->path().string(), static_cast<std::int64_t>(ranges[k].offset_bytes), n,
                                 x.nbytes);
        }
        throw error(x.error, writing ? "batch write" : "batch read", w.file->path().string(),
                    static_cast<std::int64_t>(ranges[k].offset_bytes), n);
      }
      w.latency_ns.push_back(static_cast<std::uint64_t>(x.latency_s * 1e9));
      ++w.ops;
      w.bytes.fetch_add(n, std::memory_order_relaxed);
      if (j.verify) {
        if (writing) {
          w.written.emplace_back(ranges[k].offset_bytes, n);
        } else {
          check(w, ranges[k].offset_bytes, n, scratch, k * cap);
        }
      }
    }
    w.routes.host += r.routes.host;
    w.routes.staged += r.routes.staged;
    w.routes.gds += r.routes.gds;
    w.routes.requests += r.routes.requests;
    w.routes.buffered += r.routes.buffered;
    ++w.routes.batches;
  }
  w.end = clock_type::now();
}

void verify_writes(worker& w) {
  std::vector<std::byte> scratch(w.job->io.max_bytes);
  for (auto [off, n] : w.written) {
    if (!w.verify_ok) break;
    std::size_t got = w.xfer->read(*w.file, off, n);
    if (got != n) {
      w.verify_ok = false;
      w.verify_message = fmt::format("{}: read back {} of {} bytes at offset {}", w.file->path().string(), got, n, off);
      break;
    }
    check(w, off, n, scratch);
  }
}

struct job_state {
  const job_spec* spec = nullptr;
  std::vector<std::filesystem::path> files;
  std::vector<remove_on_signal> remove_if_interrupted;
  std::vector<file_handle> handles;
  std::vector<std::unique_ptr<worker>> workers;
  job_result result;
};

double mean_residency(const std::vector<std::filesystem::path>& files, std::string* why) {
  double sum = 0;
  for (const auto& f : files) {
    auto r = page_cache_residency(f, why);
    if (!r) return -1;
    sum += *r;
  }
  return sum / static_cast<double>(files.size());
}

std::optional<double> residency(const std::vector<std::filesystem::path>& files, std::string* why) {
  double r = mean_residency(files, why);
  if (r < 0) return std::nullopt;
  return r;
}

// Runs a page-cache operation on every file; returns the last error text (empty when all succeeded).
std::string on_each_file(const std::vector<std::filesystem::path>& files,
                         std::string (*op)(const std::filesystem::path&)) {
  std::string err;
  for (const auto& f : files) {
    if (std::string e = op(f); !e.empty()) err = std::move(e);
  }
  return err;
}

void prepare(job_state& s, const run_options& opt) {
  const job_spec& j = *s.spec;
  validate(j);
  job_result& r = s.result;
  r.job = j;
  if (!j.file.empty()) {
    s.files.push_back(j.file);
  } else {
    for (unsigned n = 0; n < j.threads; ++n) s.files.push_back(j.directory / fmt::format("gdsio.{}", n));
  }
  settings cfg = default_settings();
  // Each worker keeps exactly one request in flight (gdsio's queue depth): no splitting a request across the pool.
  cfg.inline_bytes = std::max<std::size_t>(cfg.inline_bytes, j.io.max_bytes);
  if (j.no_direct || j.xfer.page_cache) cfg.direct = direct_mode::off;
  switch (j.xfer.kind) {
    case xfer_kind::gds: cfg.mode = path_mode::gds; break;
    case xfer_kind::staged: cfg.mode = path_mode::staged; break;
    case xfer_kind::compat: cfg.mode = path_mode::compat; break;
    default: break;
  }
  const bool writing = is_write(j.type);
  for (const auto& f : s.files) {
    std::error_code ec;
    const bool existed = std::filesystem::exists(f, ec);
    open_options oo;
    oo.create = writing;
    // A file this run creates holds nothing finished until the run ends: an interrupted run removes it.
    if (!existed && writing) s.remove_if_interrupted.emplace_back(f);
    s.handles.emplace_back(f, writing ? open_mode::read_write : open_mode::read, oo, cfg);
    if (!existed) r.created.push_back(f);
  }
  path_report p = describe_path(j.xfer.kind, s.handles.front(), j.gpu);
  if (j.xfer.kind == xfer_kind::gds && (p.path != "gds" || !p.direct_possible)) {
    // Asking for gds where no direct route exists would measure cuFile failing or falling back, not GDS.
    std::string reasons;
    for (const auto& x : p.reasons) {
      if (x == "GDSKIT_MODE=gds") continue;
      reasons += (reasons.empty() ? "" : "; ") + (x.rfind("warning: ", 0) == 0 ? x.substr(9) : x);
    }
    // A file this run created is removed again: a refused run leaves nothing behind.
    for (const auto& f : r.created) {
      std::error_code rm_ec;
      std::filesystem::remove(f, rm_ec);
    }
    throw usage_error(fmt::format("-x gds: no direct path for {}: {}. -x staged is gdskit's best path here; "
                                  "-x compat measures cuFile's POSIX mode (gdskit doctor explains each reason)",
                                  s.files.front().string(), reasons));
  }
  r.path_ran = p.path;
  r.reasons = p.reasons;
  if (writing && !r.created.empty()) {
    // A file the run creates gets its final size before the timed phase: O_DIRECT writes past the end of a
    // file are serialised by file systems such as ext4 (each one extends it), which would measure the
    // file system's size updates instead of the device, and a file of the job's size that already existed
    // would not pay them either.
    const std::uint64_t end = j.offset_bytes + (j.file.empty() ? 1 : j.threads) * j.size_bytes;
    for (std::size_t n = 0; n < s.files.size(); ++n) {
      if (std::find(r.created.begin(), r.created.end(), s.files[n]) != r.created.end()) s.handles[n].truncate(end);
    }
    r.reasons.push_back(fmt::format("files this run created were sized to {} first (ftruncate)", format_size(end)));
  }
  if (j.xfer.page_cache || j.no_direct) r.reasons.push_back(j.xfer.page_cache ? "gdsio 4: through the page cache" : "-O 1: page cache");
  if (j.numa_node) r.reasons.push_back(fmt::format("workers on NUMA node {} (-n)", *j.numa_node));
  if (!j.xfer.note.empty()) r.reasons.push_back(fmt::format("gdsio -x {}: {}", j.xfer.gdsio_number, j.xfer.note));
  if (opt.learn) r.reasons.push_back("--learn: transfers start from learned shapes and remember the ones they converge to");
  r.requested_bytes = j.size_bytes * j.threads;
  r.residency_before = residency(s.files, &r.residency_note);
  if (opt.cold) {
    r.cold_asked = true;
    r.drop_error = on_each_file(s.files, drop_page_cache);
    r.residency_after_drop = residency(s.files, &r.residency_note);
  }
  if (opt.warm) {
    r.warm_asked = true;
    r.warm_error = on_each_file(s.files, fill_page_cache);
    r.residency_before = residency(s.files, &r.residency_note);
  }
  r.cufile_stats = cufile_stats_note(j.xfer.kind);  // empty: counted around the timed phase
  for (unsigned n = 0; n < j.threads; ++n) {
    auto w = std::make_unique<worker>();
    w->job = &j;
    w->file = j.file.empty() ? &s.handles[n] : &s.handles.front();
    w->begin = j.offset_bytes + (j.file.empty() ? 0 : std::uint64_t{n} * j.size_bytes);
    w->length = j.size_bytes;
    w->xfer = make_transfer(j.xfer.kind, std::size_t{batch_ranges(j)} * j.io.max_bytes, j.gpu, j.xfer.stream);
    // Seeded per worker, so a read run with the same -k, -w, -o, -s replays a write run's offsets and sizes.
    w->rng.seed(j.seed * 1000003ULL + n);
    if (!writing || !j.verify) w->latency_ns.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(j.size_bytes / j.io.min_bytes + 1, 1 << 20)));
    s.workers.push_back(std::move(w));
  }
}

// A batch job's path is the routes the core took, not the planner's single-range answer.
void note_routes(job_result& r, const std::vector<std::unique_ptr<worker>>& workers) {
  batch_route_counts c;
  for (const auto& w : workers) {
    c.host += w->routes.host;
    c.staged += w->routes.staged;
    c.gds += w->routes.gds;
    c.requests += w->routes.requests;
    c.buffered += w->routes.buffered;
    c.batches += w->routes.batches;
  }
  r.routes = c;
  const int used = (c.host > 0) + (c.staged > 0) + (c.gds > 0);
  if (used == 1) r.path_ran = c.host > 0 ? "host" : c.staged > 0 ? "staged" : "gds";
  else if (used > 1) r.path_ran = "mixed";
  r.reasons.insert(r.reasons.begin(),
                   fmt::format("batch core: {} batches of up to {} ranges; ranges by route: host {}, staged {}, "
                               "cuFile {}; {} file requests, {} of them through the page cache (not O_DIRECT)",
                               c.batches, batch_ranges(r.job), c.host, c.staged, c.gds, c.requests, c.buffered));
}

}  // namespace

std::vector<job_result> run_jobs(const std::vector<job_spec>& jobs, const run_options& opt, const hooks& h) {
  std::vector<job_state> states(jobs.size());
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    states[k].spec = &jobs[k];
    prepare(states[k], opt);
  }
  std::vector<worker*> all;
  for (auto& s : states)
    for (auto& w : s.workers) all.push_back(w.get());

  std::atomic<bool> stop{false};
  std::mutex err_mu;
  std::exception_ptr first_error;
  std::latch ready(static_cast<std::ptrdiff_t>(all.size()) + 1);
  clock_type::time_point start;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  threads.reserve(all.size());
  try {
    for (worker* w : all) {
      if (h.before_thread) h.before_thread(threads.size());
      threads.emplace_back([&, w] {
        try {
          preload(*w);
        } catch (...) {
          std::lock_guard lk(err_mu);
          if (!first_error) first_error = std::current_exception();
          stop = true;
        }
        ready.arrive_and_wait();
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        if (stop.load()) return;
        try {
          if (is_batch(w->job->xfer.kind)) run_batch_worker(*w, stop, start);
          else run_worker(*w, stop, start);
        } catch (...) {
          std::lock_guard lk(err_mu);
          if (!first_error) first_error = std::current_exception();
          stop = true;
          w->end = clock_type::now();
        }
      });
    }
  } catch (...) {
    // Out of threads (RLIMIT_NPROC, memory): release the workers that did start and join them; files this run
    // created hold nothing yet and are removed.
    const std::size_t started = threads.size();
    stop = true;
    ready.count_down(static_cast<std::ptrdiff_t>(all.size() - started) + 1);
    go.store(true, std::memory_order_release);
    for (auto& t : threads) t.join();
    for (auto& s : states) {
      s.handles.clear();
      for (const auto& f : s.result.created) {
        std::error_code ec;
        std::filesystem::remove(f, ec);
      }
    }
    try {
      throw;
    } catch (const std::system_error& e) {
      throw error(e.code(), fmt::format("starting worker thread {} of {} (-w {})", started + 1, all.size(),
                                        all.size()));
    }
  }
  // cuFile statistics are process-wide: one snapshot before and after the timed phase (verification
  // read-backs come later and are not counted).
  unsigned cufile_jobs = 0;
  for (auto& s : states)
    if (s.result.cufile_stats.empty()) ++cufile_jobs;
  shim::cufile_path_counters stats0;
  if (cufile_jobs > 0) stats0 = shim::cufile_read_counters();
  ready.arrive_and_wait();
  const cpu_times cpu0 = process_cpu();
  start = clock_type::now();
  go.store(true, std::memory_order_release);

  std::atomic<bool> finished{false};
  std::thread watcher;
  if (h.progress) {
    // No progress is no reason to fail a run: without a thread for it, the run goes on silently.
    try {
      watcher = std::thread([&] {
        while (!finished.load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
          std::uint64_t b = 0;
          for (worker* w : all) b += w->bytes.load(std::memory_order_relaxed);
          h.progress(b, std::chrono::duration<double>(clock_type::now() - start).count());
        }
      });
    } catch (const std::system_error&) {
    }
  }
  for (auto& t : threads) t.join();
  const cpu_times cpu1 = process_cpu();
  shim::cufile_path_counters stats1;
  if (cufile_jobs > 0) stats1 = shim::cufile_read_counters();
  finished = true;
  if (watcher.joinable()) watcher.join();
  if (first_error) std::rethrow_exception(first_error);

  std::uint64_t total_bytes = 0;
  for (worker* w : all) total_bytes += w->bytes.load();
  for (auto& s : states) {
    job_result& r = s.result;
    std::vector<std::uint64_t> lat;
    clock_type::time_point end = start;
    for (auto& w : s.workers) {
      r.bytes += w->bytes.load();
      r.ops += w->ops;
      lat.insert(lat.end(), w->latency_ns.begin(), w->latency_ns.end());
      end = std::max(end, w->end);
    }
    r.seconds = std::chrono::duration<double>(end - start).count();
    r.latency = summarize_latency(lat);
    if (is_batch(s.spec->xfer.kind)) note_routes(r, s.workers);
    // Process CPU time is shared by concurrent jobs: each gets its share by bytes moved.
    const double share = total_bytes ? static_cast<double>(r.bytes) / static_cast<double>(total_bytes) : 0.0;
    r.cpu_user_s = (cpu1.user - cpu0.user) * share;
    r.cpu_sys_s = (cpu1.sys - cpu0.sys) * share;
    r.residency_after = residency(s.files, &r.residency_note);
    if (r.cufile_stats.empty()) {
      if (!stats0.available || !stats1.available) {
        r.cufile_stats = "not available: cuFileGetStatsL3 failed (statistics could not be read)";
      } else {
        cufile_counts d = delta(stats0, stats1);
        d.shared = cufile_jobs > 1;
        r.cufile_counters = d;
        r.cufile_stats = describe_cufile_counts(d);
      }
    }
  }
  // Verification after the timed phase: write runs read back every range they wrote.
  for (auto& s : states) {
    const job_spec& j = *s.spec;
    if (!j.verify) continue;
    if (is_write(j.type)) {
      for (auto& hnd : s.handles) hnd.sync();
      if (h.after_write) h.after_write(j, s.files);
      for (auto& w : s.workers) verify_writes(*w);
    }
    job_result& r = s.result;
    r.verified = true;
    for (auto& w : s.workers) {
      r.verified_bytes += w->verified;
      if (!w->verify_ok && r.verify_ok) {
        r.verify_ok = false;
        r.verify_message = w->verify_message;
      }
    }
  }
  std::vector<job_result> out;
  for (auto& s : states) out.push_back(std::move(s.result));
  return out;
}

std::string_view cufile_path_of(const cufile_counts& c) noexcept {
  const std::uint64_t n = c.reads + c.writes;
  const std::uint64_t posix = c.posix_reads + c.posix_writes;
  const std::uint64_t direct = c.p2p_reads + c.nvfs_reads + c.p2p_writes + c.nvfs_writes;
  if (n == 0) return "none";
  if (posix >= n) return "compat";
  if (posix == 0 && direct > 0) return "direct";
  return "mixed";
}

std::string describe_cufile_counts(const cufile_counts& c) {
  std::string s = fmt::format("reads n={} (p2p {}, nvfs {}, posix {}), writes n={} (p2p {}, nvfs {}, posix {}): ",
                              c.reads, c.p2p_reads, c.nvfs_reads, c.posix_reads, c.writes, c.p2p_writes,
                              c.nvfs_writes, c.posix_writes);
  const std::string_view path = cufile_path_of(c);
  if (path == "compat") s += "compat: every cuFile request went through POSIX (host memory), posix == n";
  else if (path == "direct") s += "direct: no request went through POSIX (P2P DMA via PCI P2PDMA or nvidia-fs)";
  else if (path == "mixed")
    s += fmt::format("mixed: {} of {} requests went through POSIX", c.posix_reads + c.posix_writes, c.reads + c.writes);
  else s += "no cuFile read or write was counted (this path did not issue cuFileRead/cuFileWrite)";
  if (c.shared) s += " [process-wide: shared by the concurrent cuFile jobs]";
  return s;
}

job_result total_of(const std::vector<job_result>& results) {
  job_result t;
  if (results.empty()) return t;
  t.job = results.front().job;
  t.job.name = "total";
  t.job.threads = 0;
  t.path_ran = results.front().path_ran;
  t.residency_note = "per job";
  t.cufile_stats = "per job";
  // Concurrent cuFile jobs share one process-wide delta: the total shows it once, not summed.
  for (const auto& r : results) {
    if (r.cufile_counters) {
      t.cufile_counters = r.cufile_counters;
      t.cufile_stats = r.cufile_stats;
      break;
    }
  }
  for (const auto& r : results) {
    t.job.threads += r.job.threads;
    t.bytes += r.bytes;
    t.requested_bytes += r.requested_bytes;
    t.ops += r.ops;
    t.seconds = std::max(t.seconds, r.seconds);
    t.cpu_user_s += r.cpu_user_s;
    t.cpu_sys_s += r.cpu_sys_s;
    // Ops-weighted mean latency; percentiles of a union are not derivable from per-job percentiles, so the
    // total reports the worst job's.
    t.latency.avg_us += r.latency.avg_us * static_cast<double>(r.ops);
    t.latency.p50_us = std::max(t.latency.p50_us, r.latency.p50_us);
    t.latency.p99_us = std::max(t.latency.p99_us, r.latency.p99_us);
    t.latency.p999_us = std::max(t.latency.p999_us, r.latency.p999_us);
    t.latency.max_us = std::max(t.latency.max_us, r.latency.max_us);
    if (r.path_ran != t.path_ran) t.path_ran = "mixed";
    t.created.insert(t.created.end(), r.created.begin(), r.created.end());
    t.verified = t.verified || r.verified;
    t.verified_bytes += r.verified_bytes;
    if (!r.verify_ok && t.verify_ok) {
      t.verify_ok = false;
      t.verify_message = r.verify_message;
    }
  }
  if (t.ops) t.latency.avg_us /= static_cast<double>(t.ops);
  return t;
}

}  // namespace gdskit::bench
