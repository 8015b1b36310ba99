// `gdskit bench kv`: phases, ceilings, the one-file-per-block baseline and the report.
#include "bench/kv_bench.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "common/json_text.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/error.hpp"
#include "gpu/cuda_raii.hpp"
#include "posix/syscalls.hpp"
#include "shim/cuda_driver.hpp"

extern char** environ;

namespace gdskit::bench {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

// ---- blocks the bench writes and checks ----

namespace {

// One pseudo-random pattern for every block, grown to the largest block asked for; a block is the pattern
// with its key id and page number stamped at the start of each 4 KiB page, so a block served for the wrong
// key, a torn block or stale bytes all fail the check.
const std::uint8_t* pattern(std::size_t n) {
  static std::mutex m;
  static std::vector<std::uint8_t>* p = new std::vector<std::uint8_t>();
  std::lock_guard lock(m);
  if (p->size() < n) {
    std::vector<std::uint8_t> grown(std::max<std::size_t>(n, std::size_t{1} << 20));
    std::mt19937_64 rng(0x6b76);
    for (std::size_t i = 0; i + 8 <= grown.size(); i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(grown.data() + i, &v, 8);
    }
    // The old pattern stays valid for blocks made from it: it is a prefix of the same stream.
    static std::vector<std::vector<std::uint8_t>>* kept = new std::vector<std::vector<std::uint8_t>>();
    kept->push_back(std::move(*p));
    *p = std::move(grown);
  }
  return p->data();
}

void stamp(std::uint64_t id, std::uint8_t* dst, std::size_t n) {
  for (std::size_t page = 0; page * 4096 < n; ++page) {
    const std::uint64_t words[2] = {id ^ 0x9e3779b97f4a7c15ull, page};
    std::memcpy(dst + page * 4096, words, std::min<std::size_t>(16, n - page * 4096));
  }
}

}  // namespace

void kv_fill_block(std::uint64_t id, std::uint8_t* dst, std::size_t n) {
  std::memcpy(dst, pattern(n), n);
  stamp(id, dst, n);
}

bool kv_check_block(std::uint64_t id, const std::uint8_t* data, std::size_t n) {
  const std::uint8_t* p = pattern(n);
  for (std::size_t page = 0; page * 4096 < n; ++page) {
    const std::size_t at = page * 4096;
    const std::size_t len = std::min<std::size_t>(4096, n - at);
    const std::uint64_t words[2] = {id ^ 0x9e3779b97f4a7c15ull, page};
    const std::size_t head = std::min<std::size_t>(16, len);
    if (std::memcmp(data + at, words, head) != 0) return false;
    if (std::memcmp(data + at + head, p + at + head, len - head) != 0) return false;
  }
  return true;
}

zipf_ranks::zipf_ranks(std::size_t n, double s) : cdf_(n) {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
    cdf_[i] = sum;
  }
  for (auto& c : cdf_) c /= sum;
}

std::size_t zipf_ranks::operator()(double u) const {
  const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
  return std::min<std::size_t>(static_cast<std::size_t>(it - cdf_.begin()), cdf_.size() - 1);
}

namespace {

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// What one phase measured.
struct phase {
  std::string name;
  double seconds = 0;
  std::uint64_t bytes = 0;   // payload moved (blocks stored, hits read)
  std::uint64_t calls = 0, keys = 0, hits = 0, misses = 0, stored = 0, failed = 0, wrong = 0, hangs = 0;
  double cpu_s = 0;          // process CPU minus the bench's own work (filling, checking, copies for checks)
  latency_stats latency;     // per call, microseconds
  std::optional<double> raw_gib_s;  // the ceiling it is compared with
  nlohmann::json extra = nlohmann::json::object();
  double gib_s() const { return seconds > 0 ? static_cast<double>(bytes) / gib / seconds : 0; }
  double cpu_per_gib() const { return bytes > 0 ? cpu_s / (static_cast<double>(bytes) / gib) : 0; }
};

// Per-thread tallies, merged into a phase.
struct tally {
  std::vector<std::uint64_t> lat_ns;
  std::uint64_t bytes = 0, calls = 0, keys = 0, hits = 0, misses = 0, stored = 0, failed = 0, wrong = 0, hangs = 0;
  double overhead_cpu_s = 0;
};

struct no_finish {
  void operator()(unsigned, tally&) const {}
};

// Runs `body(thread, tally, rng)` on `threads` threads until it returns false or `seconds` pass (0: no time
// limit), then `finish(thread, tally)` on each, then merges.

template <class Body, class Finish = no_finish>
phase run_threads(const std::string& name, unsigned threads, double seconds, std::uint64_t seed, Body&& body,
                  Finish&& finish = {}) {
  std::vector<tally> t(threads);
  std::atomic<bool> stop{false};
  const double cpu0 = process_cpu_s();
  const auto t0 = clock_type::now();
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      std::mt19937_64 rng(seed * 1000003 + i);
      while (!stop.load(std::memory_order_relaxed)) {
        if (seconds > 0 && seconds_since(t0) >= seconds) break;
        if (!body(i, t[i], rng)) break;
      }
      finish(i, t[i]);
    });
  }
  for (auto& th : pool) th.join();
  phase p;
  p.name = name;
  p.seconds = seconds_since(t0);
  p.cpu_s = process_cpu_s() - cpu0;
  std::vector<std::uint64_t> all;
  for (auto& x : t) {
    all.insert(all.end(), x.lat_ns.begin(), x.lat_ns.end());
    p.bytes += x.bytes;
    p.calls += x.calls;
    p.keys += x.keys;
    p.hits += x.hits;
    p.misses += x.misses;
    p.stored += x.stored;
    p.failed += x.failed;
    p.wrong += x.wrong;
    p.hangs += x.hangs;
    p.cpu_s -= x.overhead_cpu_s;
  }
  p.cpu_s = std::max(0.0, p.cpu_s);
  p.latency = summarize_latency(all);
  return p;
}

// ---- the device's raw rate ----

struct raw_rates {
  double fresh_write_gib_s = 0;  // into blocks never written since the file was made (what a new store does)
  double write_gib_s = 0, read_gib_s = 0;
  latency_stats write_latency, read_latency;
  unsigned fresh_write_depth = 0, write_depth = 0, read_depth = 0;  // requests in flight of each best rate
  bool direct = false;
  std::string note;
};

struct aligned_buffer {
  explicit aligned_buffer(std::size_t n) : p(static_cast<std::uint8_t*>(std::aligned_alloc(4096, pages(n)))) {
    if (p == nullptr) throw std::bad_alloc();
    // Faulted in here, before any phase's clock: a hundred callers' first puts would otherwise time the
    // kernel zeroing a gigabyte of their memory.
    std::memset(p, 0, pages(n));
  }
  static std::size_t pages(std::size_t n) { return std::max<std::size_t>(4096, (n + 4095) / 4096 * 4096); }
  ~aligned_buffer() { std::free(p); }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  std::uint8_t* p;
};

// `depth` threads of plain pwrite/pread of whole blocks at random block offsets of one file per folder, with
// O_DIRECT where the file system takes it: what the device gives without any library in between.
raw_rates measure_raw(const kv_options& o, std::size_t block, unsigned depth, std::uint64_t file_bytes) {
  raw_rates r;
  if (o.dirs.empty()) return r;
  const std::uint64_t blocks = std::max<std::uint64_t>(1, file_bytes / block);
  std::vector<int> fds;
  std::vector<fs::path> files;
  for (const auto& d : o.dirs) {
    const fs::path f = d / "gdskit-kv-bench-raw";
    int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      r.direct = true;
    } else {
      fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      r.note = "the file system refuses O_DIRECT: the raw rate is through the page cache";
    }
    if (fd < 0) throw error(errno_code(errno), "open", f.string(), -1, 0, "the raw-rate file");
    // Reserved like the store's data file, so both write into allocated blocks.
    if (::fallocate(fd, 0, 0, static_cast<off_t>(blocks * block)) != 0 && ::ftruncate(fd, static_cast<off_t>(blocks * block)) != 0) {
      const int e = errno;
      ::close(fd);
      throw error(errno_code(e), "fallocate", f.string(), 0, blocks * block, "the raw-rate file");
    }
    fds.push_back(fd);
    files.push_back(f);
  }
  // Writes: every block of every file once (so that the reads find data, not holes), in random order.
  std::vector<std::uint64_t> order(blocks * fds.size());
  for (std::uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed));
  std::atomic<std::size_t> next{0};
  std::atomic<int> failure{0};
  // A write pass over the whole file in random order (seconds 0), or random writes or reads for `seconds`.
  auto run = [&](bool write, double seconds, latency_stats& lat) {
    std::vector<std::vector<std::uint64_t>> ns(depth);
    std::atomic<std::uint64_t> bytes{0};
    const auto t0 = clock_type::now();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < depth; ++t) {
      pool.emplace_back([&, t] {
        aligned_buffer buf(block);
        kv_fill_block(t, buf.p, block);
        std::mt19937_64 rng(o.seed + t);
        for (;;) {
          std::uint64_t which = 0;
          if (seconds == 0) {
            which = next.fetch_add(1);
            if (which >= order.size()) break;
            which = order[which];
          } else {
            if (seconds_since(t0) >= seconds) break;
            which = rng() % order.size();
          }
          const int fd = fds[which % fds.size()];
          const off_t off = static_cast<off_t>((which / fds.size()) * block);
          const auto c0 = clock_type::now();
          std::size_t done = 0;
          while (done < block) {
            const ssize_t n = write ? ::pwrite(fd, buf.p + done, block - done, off + static_cast<off_t>(done))
                                    : ::pread(fd, buf.p + done, block - done, off + static_cast<off_t>(done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
              failure = n < 0 ? errno : EIO;
              return;
            }
            done += static_cast<std::size_t>(n);
          }
          ns[t].push_back(static_cast<std::uint64_t>((clock_type::now() - c0).count()));
          bytes += block;
        }
      });
    }
    for (auto& th : pool) th.join();
    const double s = seconds_since(t0);
    std::vector<std::uint64_t> all;
    for (auto& v : ns) all.insert(all.end(), v.begin(), v.end());
    lat = summarize_latency(all);
    return s > 0 ? static_cast<double>(bytes.load()) / gib / s : 0;
  };
  latency_stats fresh_latency;
  r.fresh_write_gib_s = run(true, 0, fresh_latency);
  r.write_gib_s = run(true, std::max(1.0, o.seconds / 2), r.write_latency);
  r.read_gib_s = run(false, std::max(1.0, o.seconds / 2), r.read_latency);
  for (int fd : fds) ::close(fd);
  for (const auto& f : files) {
    std::error_code ec;
    fs::remove(f, ec);
  }
  if (failure != 0) throw error(errno_code(failure), "raw I/O", files.front().string(), -1, block, "measuring the raw rate");
  return r;
}

// ---- one block size ----

constexpr std::uint64_t churn_base = std::uint64_t{1} << 40;
constexpr std::uint64_t mix_base = std::uint64_t{2} << 40;
constexpr std::uint64_t crash_base = std::uint64_t{3} << 40;
constexpr std::uint64_t fault_base = std::uint64_t{4} << 40;

std::vector<kv::key> keys_of(const std::vector<std::uint64_t>& ids) {
  std::vector<kv::key> out;
  for (std::uint64_t id : ids) out.push_back(kv::key::from_uint(id));
  return out;
}

// GPU memory with a pinned host mirror for the bench's own filling and checking, copied on a stream of its own.
// Pageable copies on the default stream would serialize every caller's copies on the GPU (the legacy default
// stream is one per context), and a phase would run at the rate of the bench's copies instead of the store's.
class gpu_mirror {
 public:
  gpu_mirror(std::size_t nbytes, int gpu)
      : host_(nbytes, gpu), device_(nbytes, gpu), stream_(gpu, shim::CU_STREAM_NON_BLOCKING) {}
  std::uint8_t* host() const noexcept { return static_cast<std::uint8_t*>(host_.data()); }
  void* device() const noexcept { return device_.data(); }
  int gpu() const noexcept { return device_.device(); }
  void to_device(std::size_t offset, std::size_t n) { copy(true, offset, n); }
  void to_host(std::size_t offset, std::size_t n) { copy(false, offset, n); }

 private:
  void copy(bool to_device, std::size_t offset, std::size_t n) {
    const shim::cuda_api& a = shim::cuda_or_throw();
    gpu::context_guard ctx(device_.device());
    const auto d = reinterpret_cast<shim::CUdeviceptr>(static_cast<std::uint8_t*>(device_.data()) + offset);
    if (to_device) {
      shim::check_cuda(a.cuMemcpyHtoDAsync(d, host() + offset, n, stream_.get()), "cuMemcpyHtoDAsync");
    } else {
      shim::check_cuda(a.cuMemcpyDtoHAsync(host() + offset, d, n, stream_.get()), "cuMemcpyDtoHAsync");
    }
    shim::check_cuda(a.cuStreamSynchronize(stream_.get()), "cuStreamSynchronize");
  }
  pinned_buffer host_;
  device_buffer device_;
  gpu::cuda_stream stream_;
};

// Memory of one caller thread: `batch` blocks, on the host or the GPU (with a host mirror for filling and
// checks).
struct rows_memory {
  rows_memory(std::size_t batch, std::size_t block, int gpu) : block_(block) {
    if (gpu >= 0) {
      mirror = std::make_unique<gpu_mirror>(batch * block, gpu);
    } else {
      host = std::make_unique<aligned_buffer>(batch * block);
    }
  }
  std::uint8_t* host_rows() const { return mirror ? mirror->host() : host->p; }
  buffer_view row(std::size_t i) {
    if (mirror) return {static_cast<std::uint8_t*>(mirror->device()) + i * block_, block_, memory_kind::device, mirror->gpu()};
    return buffer_view::host(host->p + i * block_, block_);
  }
  void fill(const std::vector<std::uint64_t>& ids) {
    for (std::size_t i = 0; i < ids.size(); ++i) kv_fill_block(ids[i], host_rows() + i * block_, block_);
    if (mirror) mirror->to_device(0, ids.size() * block_);
  }
  std::vector<buffer_view> rows(std::size_t n) {
    std::vector<buffer_view> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(row(i));
    return out;
  }
  // Brings the first `n` rows to the host (GPU rows: one copy for the call), for check().
  void fetch(std::size_t n) {
    if (mirror) mirror->to_host(0, n * block_);
  }
  // Whether row i (fetched) holds block `id`.
  bool check(std::size_t i, std::uint64_t id) const { return kv_check_block(id, host_rows() + i * block_, block_); }
  std::unique_ptr<aligned_buffer> host;
  std::unique_ptr<gpu_mirror> mirror;
  std::size_t block_;
};

// One block of the baseline's: host memory, and with a GPU its GPU copy (the peers' hop between the two).
struct block_buffer {
  block_buffer(std::size_t block, int gpu) : block_(block) {
    if (gpu >= 0) {
      mirror = std::make_unique<gpu_mirror>(block, gpu);
    } else {
      plain.resize(block);
    }
  }
  std::uint8_t* host() { return mirror ? mirror->host() : plain.data(); }
  void to_device(std::size_t n = SIZE_MAX) {
    if (mirror) mirror->to_device(0, std::min(n, block_));
  }
  void to_host(std::size_t n = SIZE_MAX) {
    if (mirror) mirror->to_host(0, std::min(n, block_));
  }
  std::unique_ptr<gpu_mirror> mirror;
  std::vector<std::uint8_t> plain;
  std::size_t block_;
};

struct block_run {
  std::size_t block = 0;
  unsigned batch = 0;
  std::uint64_t slots = 0;
  raw_rates raw;
  std::vector<phase> phases;
  nlohmann::json crash, faults;
  std::string path_note;
  bool direct = false;
  std::string direct_reason;
  std::uint64_t max_physical = 0;
  bool capacity_kept = true;
};

std::vector<fs::path> store_dirs(const kv_options& o, std::size_t block, const char* what) {
  std::vector<fs::path> out;
  for (const auto& d : o.dirs) out.push_back(d / fmt::format("gdskit-kv-bench-{}-{}", what, block));
  return out;
}

kv::store_options store_options_for(const kv_options& o, std::size_t block) {
  kv::store_options so;
  so.paths = store_dirs(o, block, "store");
  so.capacity_bytes = o.capacity_bytes;
  so.block_bytes = block;
  so.name_space = "gdskit bench kv";
  so.mode = o.mode;
  so.deadline = std::chrono::seconds(10);
  // Submitted puts finish on these (blocking calls need none).
  so.async_workers = o.in_flight == 1 ? 1 : std::min(o.threads * o.in_flight, 64u);
  return so;
}

// The call pattern every store phase shares: ids for one call, then the call, then the checks. Each caller
// keeps up to `in_flight` calls in flight (submit_put / submit_get, as an engine's offload path does), so that
// filling and checking blocks, the bench's own work, overlaps the store's; with 1, each call is the blocking
// put / get. A call's latency: with calls in flight the store's own (op_result::seconds, from the call until its
// last block ended); with blocking calls the time the call took.
struct caller {
  kv::block_store& store;
  std::size_t block;
  unsigned batch;
  unsigned in_flight;
  int gpu;
  std::chrono::nanoseconds deadline;

  struct call {
    bool put = false;
    std::vector<std::uint64_t> ids;
    std::vector<kv::key> keys;
    std::vector<buffer_view> rows;
    std::unique_ptr<rows_memory> memory;
    kv::op_future future;
    clock_type::time_point c0;
  };
  struct lane {
    std::deque<call> busy;
    std::vector<std::unique_ptr<rows_memory>> idle;
  };
  std::vector<lane> lanes;

  caller(kv::block_store& s, std::size_t b, unsigned k, unsigned threads, unsigned depth, int g,
         std::chrono::nanoseconds d)
      : store(s), block(b), batch(k), in_flight(std::max(1u, depth)), gpu(g), deadline(d), lanes(threads) {
    for (auto& l : lanes) {
      for (unsigned i = 0; i < in_flight; ++i) l.idle.push_back(std::make_unique<rows_memory>(k, b, g));
    }
  }

  void put(unsigned th, tally& t, const std::vector<std::uint64_t>& ids) {
    call c = begin(th, ids, true);
    const double o0 = thread_cpu_s();
    c.memory->fill(ids);
    t.overhead_cpu_s += thread_cpu_s() - o0;
    issue(th, t, std::move(c));
  }

  void get(unsigned th, tally& t, const std::vector<std::uint64_t>& ids) { issue(th, t, begin(th, ids, false)); }

  // Waits for the thread's calls still in flight (at the end of a phase).
  void drain(unsigned th, tally& t) {
    while (!lanes[th].busy.empty()) finish_oldest(th, t);
  }

 private:
  call begin(unsigned th, const std::vector<std::uint64_t>& ids, bool put) {
    lane& l = lanes[th];
    call c;
    c.put = put;
    c.ids = ids;
    c.keys = keys_of(ids);
    c.memory = std::move(l.idle.back());
    l.idle.pop_back();
    c.rows = c.memory->rows(ids.size());
    return c;
  }

  void issue(unsigned th, tally& t, call c) {
    lane& l = lanes[th];
    c.c0 = clock_type::now();
    if (in_flight == 1) {
      const kv::op_result r = c.put ? store.put(c.keys, c.rows) : store.get(c.keys, c.rows);
      account(t, c, r);
      l.idle.push_back(std::move(c.memory));
      return;
    }
    c.future = c.put ? store.submit_put(c.keys, c.rows) : store.submit_get(c.keys, c.rows);
    l.busy.push_back(std::move(c));
    while (l.busy.size() >= in_flight) finish_oldest(th, t);
  }

  void finish_oldest(unsigned th, tally& t) {
    lane& l = lanes[th];
    call c = std::move(l.busy.front());
    l.busy.pop_front();
    const kv::op_result& r = c.future.get();
    account(t, c, r);
    // A put past its deadline may still be read by the kernel: its memory is not refilled before that ends.
    c.future.wait_released();
    l.idle.push_back(std::move(c.memory));
  }

  void account(tally& t, call& c, const kv::op_result& r) {
    const auto waited = clock_type::now() - c.c0;
    t.lat_ns.push_back(static_cast<std::uint64_t>(in_flight == 1 ? std::chrono::nanoseconds(waited).count()
                                                                   : r.seconds * 1e9));
    ++t.calls;
    if (waited > deadline + std::chrono::seconds(1)) ++t.hangs;
    t.keys += c.ids.size();
    if (c.put) {
      t.stored += r.ok_count;
      t.failed += c.ids.size() - r.ok_count;
      t.bytes += r.ok_count * block;
      return;
    }
    const double o0 = thread_cpu_s();
    if (r.ok_count != 0) c.memory->fetch(c.ids.size());
    for (std::size_t i = 0; i < c.ids.size(); ++i) {
      if (!r.ok[i]) {
        ++t.misses;
        continue;
      }
      ++t.hits;
      t.bytes += block;
      if (!c.memory->check(i, c.ids[i])) ++t.wrong;
    }
    t.overhead_cpu_s += thread_cpu_s() - o0;
  }
};

// Distinct ids for one call.
template <class Draw>
std::vector<std::uint64_t> distinct(unsigned n, Draw&& draw) {
  std::vector<std::uint64_t> ids;
  for (unsigned tries = 0; ids.size() < n && tries < 16 * n; ++tries) {
    const std::uint64_t id = draw();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

// ---- faults through the syscall seam ----

class fault_seam {
 public:
  enum class kind { none, enospc_writes, eio_reads, slow };
  fault_seam(std::set<ino_t> inodes, std::chrono::milliseconds slow) : inodes_(std::move(inodes)), slow_(slow) {
    posix::syscall_table t = posix::real_syscalls();
    t.pwrite = [this](int fd, const void* b, std::size_t n, off_t off) -> ssize_t {
      if (const int e = fault_for(fd, true)) {
        errno = e;
        return -1;
      }
      return posix::real_syscalls().pwrite(fd, b, n, off);
    };
    t.pread = [this](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
      if (const int e = fault_for(fd, false)) {
        errno = e;
        return -1;
      }
      return posix::real_syscalls().pread(fd, b, n, off);
    };
    t.uring_result = [this](bool is_write, int fd, std::uint64_t, std::size_t, int res) -> int {
      const int e = fault_for(fd, is_write);
      return e != 0 ? -e : res;
    };
    scope_ = std::make_unique<posix::scoped_syscalls>(t);
  }
  void set(kind k) { kind_ = k; }

 private:
  bool ours(int fd) const {
    struct stat st {};
    return posix::real_syscalls().fstat(fd, &st) == 0 && inodes_.count(st.st_ino) != 0;
  }
  // The errno a call on `fd` fails with now; 0: it goes ahead (on a slow device, one call in three after a sleep).
  int fault_for(int fd, bool write) {
    if (!ours(fd)) return 0;
    if (write && kind_ == kind::enospc_writes) return ENOSPC;
    if (!write && kind_ == kind::eio_reads) return EIO;
    if (kind_ == kind::slow && calls_.fetch_add(1) % 3 == 0) std::this_thread::sleep_for(slow_);
    return 0;
  }
  std::set<ino_t> inodes_;
  std::chrono::milliseconds slow_;
  std::atomic<kind> kind_{kind::none};
  std::atomic<std::uint64_t> calls_{0};
  std::unique_ptr<posix::scoped_syscalls> scope_;
};

void wait_quiet(kv::block_store& s, double limit_s) {
  const auto t0 = clock_type::now();
  while (s.stats().quarantined != 0 && seconds_since(t0) < limit_s) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// ---- an interrupted run ----

// SIGINT or SIGTERM during a run: a thread of its own, woken through a pipe by the handler (which does nothing
// else), ends the crash phase's writer, removes every file and folder the bench makes (none existed before the
// run: the flags' check refuses folders that hold them), says so and exits with 128 + the signal. A signal the
// process inherited as ignored stays ignored.
class interrupt_cleanup {
 public:
  /// Installs the handlers (once per process) and says what this run makes.
  static void arm(const kv_options& o) {
    std::vector<fs::path> paths;
    for (const auto& d : o.dirs) {
      if (!o.keep) {
        for (std::size_t b : o.block_bytes) {
          paths.push_back(d / fmt::format("gdskit-kv-bench-store-{}", b));
          paths.push_back(d / fmt::format("gdskit-kv-bench-files-{}", b));
        }
      }
      paths.push_back(d / "gdskit-kv-bench-raw");
      paths.push_back(d / "gdskit-kv-bench-progress");
    }
    interrupt_cleanup& c = instance();
    std::lock_guard lock(c.mutex_);
    c.paths_ = std::move(paths);
  }
  /// The crash phase's writer now running (0: none).
  static void writer(pid_t pid) noexcept { instance().writer_.store(pid); }

 private:
  static interrupt_cleanup& instance() {
    static auto* c = new interrupt_cleanup();  // never destroyed: its thread and handlers live with the process
    return *c;
  }
  static std::atomic<int>& write_end() {
    static std::atomic<int> fd{-1};
    return fd;
  }
  interrupt_cleanup() {
    if (::pipe2(pipe_, O_CLOEXEC) != 0) return;
    write_end().store(pipe_[1]);
    struct sigaction sa {};
    sa.sa_handler = [](int sig) {
      const int saved = errno;
      const unsigned char c = static_cast<unsigned char>(sig);
      if (const int fd = write_end().load(); fd >= 0) (void)!::write(fd, &c, 1);
      errno = saved;
    };
    ::sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction before {};
      if (::sigaction(sig, nullptr, &before) == 0 && before.sa_handler == SIG_IGN) continue;
      ::sigaction(sig, &sa, nullptr);
    }
    std::thread([this] { wait(); }).detach();
  }
  void wait() {
    unsigned char sig = 0;
    while (::read(pipe_[0], &sig, 1) != 1) {
      if (errno != EINTR) return;
    }
    if (const pid_t pid = writer_.load(); pid > 0) ::kill(pid, SIGKILL);
    std::size_t removed = 0;
    {
      std::lock_guard lock(mutex_);
      for (const auto& p : paths_) {
        std::error_code ec;
        removed += fs::remove_all(p, ec) > 0 ? 1 : 0;
      }
    }
    std::fprintf(stderr, "\ngdskit bench kv: interrupted (signal %d); removed %zu of its files and folders\n",
                 static_cast<int>(sig), removed);
    std::_Exit(128 + sig);
  }
  std::mutex mutex_;
  std::vector<fs::path> paths_;
  std::atomic<pid_t> writer_{0};
  int pipe_[2] = {-1, -1};
};

// ---- the crash phase: a writer started as a child, killed, the store reopened ----

int crash_child(const kv_options& o) {
  // Ends with the bench that started it, however the bench ends (even by SIGKILL).
  const pid_t parent = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) return 3;
  kv::block_store s(store_options_for(o, o.block_bytes.front()));
  const std::size_t block = o.block_bytes.front();
  const unsigned batch = o.batch;
  const int fd = ::open(o.crash_child_progress.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return 3;
  rows_memory m(batch, block, -1);
  // The parent wrote where this writer starts: after every key an earlier one may have put.
  std::uint64_t start = 0;
  if (::pread(fd, &start, sizeof start, 0) != sizeof start) start = 0;
  for (std::uint64_t i = start;; i += batch) {
    std::vector<std::uint64_t> ids;
    for (unsigned j = 0; j < batch; ++j) ids.push_back(crash_base + i + j);
    const std::uint64_t upto = i + batch;
    if (::pwrite(fd, &upto, sizeof upto, 0) != sizeof upto) return 3;
    m.fill(ids);
    s.put(keys_of(ids), m.rows(ids.size()));
  }
}

std::uint64_t read_progress(const fs::path& p) {
  std::uint64_t v = 0;
  std::ifstream in(p, std::ios::binary);
  in.read(reinterpret_cast<char*>(&v), sizeof v);
  return in.gcount() == sizeof v ? v : 0;
}

pid_t spawn_writer(const kv_options& o, std::size_t block, const fs::path& progress) {
  std::vector<std::string> args = {"/proc/self/exe", "bench", "kv", "--crash-child", progress.string(),
                                   "--block-sizes", std::to_string(block), "--capacity", std::to_string(o.capacity_bytes),
                                   "--batch", std::to_string(o.batch), "--durability", std::string(kv::to_string(o.mode))};
  for (const auto& d : o.dirs) {
    args.push_back("--dir");
    args.push_back(d.string());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw error(errno_code(rc), "posix_spawn", "/proc/self/exe", -1, 0, "the crash phase's writer");
  return pid;
}

// ---- the peers' design: one file per block, written to a temporary name and renamed ----

phase baseline_puts(const kv_options& o, std::size_t block, unsigned batch, std::uint64_t count, const std::vector<fs::path>& dirs) {
  std::atomic<std::uint64_t> next{0};
  std::atomic<int> failure{0};
  // With --gpu the blocks live in GPU memory, as the store's puts do: the peers copy each to pinned host memory
  // first, on a stream of their own.
  const unsigned callers = o.threads * o.in_flight;
  std::vector<std::unique_ptr<block_buffer>> memory(callers);
  for (auto& m : memory) m = std::make_unique<block_buffer>(block, o.gpu);
  phase p = run_threads("baseline put", callers, 0, o.seed, [&](unsigned th, tally& t, std::mt19937_64&) {
    const std::uint64_t first = next.fetch_add(batch);
    if (first >= count || failure != 0) return false;
    block_buffer& b = *memory[th];
    std::uint8_t* buf = b.host();
    const auto c0 = clock_type::now();
    for (std::uint64_t id = first; id < std::min(count, first + batch); ++id) {
      const double o0 = thread_cpu_s();
      kv_fill_block(id, buf, block);
      b.to_device();
      t.overhead_cpu_s += thread_cpu_s() - o0;
      b.to_host();
      const fs::path dir = dirs[id % dirs.size()];
      const fs::path final_name = dir / fmt::format("{:016x}", id);
      const fs::path tmp = dir / fmt::format("{:016x}.tmp", id);
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        failure = errno;
        return false;
      }
      std::size_t done = 0;
      while (done < block) {
        const ssize_t n = ::write(fd, buf + done, block - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          failure = n < 0 ? errno : ENOSPC;
          break;
        }
        done += static_cast<std::size_t>(n);
      }
      ::close(fd);
      if (failure != 0 || ::rename(tmp.c_str(), final_name.c_str()) != 0) {
        if (failure == 0) failure = errno;
        return false;
      }
      ++t.stored;
      t.bytes += block;
    }
    const auto ns = clock_type::now() - c0;
    t.lat_ns.push_back(static_cast<std::uint64_t>(ns.count()));
    ++t.calls;
    return true;
  });
  if (failure != 0) throw error(errno_code(failure), "baseline write", dirs.front().string(), -1, block);
  return p;
}

phase baseline_gets(const kv_options& o, std::size_t block, unsigned batch, std::uint64_t count, const std::vector<fs::path>& dirs) {
  const unsigned callers = o.threads * o.in_flight;
  std::vector<std::unique_ptr<block_buffer>> memory(callers);
  for (auto& m : memory) m = std::make_unique<block_buffer>(block, o.gpu);
  return run_threads("baseline get", callers, o.seconds, o.seed + 7, [&](unsigned th, tally& t, std::mt19937_64& rng) {
    block_buffer& b = *memory[th];
    std::uint8_t* buf = b.host();
    const auto ids = distinct(batch, [&] { return rng() % count; });
    const auto c0 = clock_type::now();
    for (std::uint64_t id : ids) {
      const fs::path f = dirs[id % dirs.size()] / fmt::format("{:016x}", id);
      const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        ++t.misses;
        continue;
      }
      std::size_t done = 0;
      while (done < block) {
        const ssize_t n = ::read(fd, buf + done, block - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
      }
      // Every get cold, as the store's O_DIRECT gets are: a block read again later comes from the device, not
      // from the page cache this read filled.
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
      ++t.hits;
      t.bytes += done;
      b.to_device(done);
      const double o0 = thread_cpu_s();
      b.to_host(done);
      if (done != block || !kv_check_block(id, buf, block)) ++t.wrong;
      t.overhead_cpu_s += thread_cpu_s() - o0;
    }
    const auto ns = clock_type::now() - c0;
    t.lat_ns.push_back(static_cast<std::uint64_t>(ns.count()));
    ++t.calls;
    t.keys += ids.size();
    return true;
  });
}

// Seconds until every dirty page of the file systems holding `dirs` is on the device (syncfs on each).
double sync_folders(const std::vector<fs::path>& dirs) {
  const auto t0 = clock_type::now();
  for (const auto& d : dirs) {
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    ::syncfs(fd);
    ::close(fd);
  }
  return seconds_since(t0);
}

// Drops the page cache of every file in `dirs` (fdatasync first: dirty pages cannot be dropped).
void drop_files(const std::vector<fs::path>& dirs) {
  for (const auto& d : dirs) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

void remove_all(const std::vector<fs::path>& dirs) {
  for (const auto& d : dirs) {
    std::error_code ec;
    fs::remove_all(d, ec);
  }
}

bool wants(const kv_options& o, const char* mix) { return std::find(o.mixes.begin(), o.mixes.end(), mix) != o.mixes.end(); }

block_run run_block(const kv_options& o, std::size_t block, std::ostream& err) {
  block_run br;
  br.block = block;
  br.batch = o.batch != 0 ? o.batch : static_cast<unsigned>(std::clamp<std::uint64_t>((std::uint64_t{8} << 20) / block, 1, 64));
  const auto dirs = store_dirs(o, block, "store");
  const auto files = store_dirs(o, block, "files");
  remove_all(dirs);
  remove_all(files);
  kv_options ob = o;
  ob.batch = br.batch;

  err << fmt::format("gdskit bench kv: {} blocks: raw rate...\n", format_size(block));
  // The device's ceiling: each rate the best of 8, 16 and 64 requests in flight (the store's depth is the
  // transfer core's to choose; a RAM-backed device reads large blocks faster 8 deep than 16 deep).
  const std::uint64_t raw_bytes = std::min<std::uint64_t>(o.capacity_bytes / o.dirs.size(), std::uint64_t{1} << 30);
  for (unsigned depth : {8u, 16u, 64u}) {
    const raw_rates r = measure_raw(o, block, depth, raw_bytes);
    auto better = [depth](double rate, double& best, unsigned& best_depth) {
      if (rate <= best) return false;
      best = rate;
      best_depth = depth;
      return true;
    };
    better(r.fresh_write_gib_s, br.raw.fresh_write_gib_s, br.raw.fresh_write_depth);
    if (better(r.write_gib_s, br.raw.write_gib_s, br.raw.write_depth)) br.raw.write_latency = r.write_latency;
    if (better(r.read_gib_s, br.raw.read_gib_s, br.raw.read_depth)) br.raw.read_latency = r.read_latency;
    br.raw.direct = r.direct;
    if (!r.note.empty()) br.raw.note = r.note;
  }

  auto so = store_options_for(o, block);
  auto store = std::make_unique<kv::block_store>(so);
  kv::store_stats st = store->stats();
  br.slots = st.slots;
  br.direct = st.direct;
  br.direct_reason = st.direct_reason;
  for (const auto& r : st.path_reasons) br.path_note += (br.path_note.empty() ? "" : "; ") + r;
  auto check_capacity = [&] {
    const kv::store_stats s = store->stats();
    br.max_physical = std::max(br.max_physical, s.physical_bytes);
    if (s.physical_bytes > o.capacity_bytes || s.blocks > s.slots) br.capacity_kept = false;
  };
  caller call(*store, block, br.batch, o.threads, o.in_flight, o.gpu, so.deadline);
  auto drain = [&](unsigned th, tally& t) { call.drain(th, t); };
  const unsigned k = br.batch;

  // Put storm: an empty store filled to its capacity.
  std::atomic<std::uint64_t> next{0};
  std::uint64_t filled = 0;
  if (wants(o, "put") || wants(o, "get") || wants(o, "mix") || wants(o, "churn") || wants(o, "crash") ||
      wants(o, "faults")) {
    err << fmt::format("gdskit bench kv: {} blocks: put storm...\n", format_size(block));
    phase p = run_threads("put storm", o.threads, 0, o.seed, [&](unsigned th, tally& t, std::mt19937_64&) {
      const std::uint64_t first = next.fetch_add(k);
      if (first >= br.slots) return false;
      std::vector<std::uint64_t> ids;
      for (std::uint64_t id = first; id < std::min<std::uint64_t>(br.slots, first + k); ++id) ids.push_back(id);
      call.put(th, t, ids);
      return true;
    }, drain);
    p.raw_gib_s = br.raw.fresh_write_gib_s;  // a new store writes blocks never written before
    filled = br.slots;
    check_capacity();
    if (wants(o, "put")) br.phases.push_back(p);
  }

  if (wants(o, "get")) {
    err << fmt::format("gdskit bench kv: {} blocks: cold get...\n", format_size(block));
    // Through O_DIRECT the page cache holds none of the store; without it, drop what it holds.
    if (!br.direct) drop_files(dirs);
    phase p = run_threads("cold get", o.threads, o.seconds, o.seed + 1, [&](unsigned th, tally& t, std::mt19937_64& rng) {
      call.get(th, t, distinct(k, [&] { return rng() % filled; }));
      return true;
    }, drain);
    p.raw_gib_s = br.raw.read_gib_s;
    br.phases.push_back(p);
  }

  if (wants(o, "mix")) {
    err << fmt::format("gdskit bench kv: {} blocks: {:.0f}/{:.0f} get/put mix...\n", format_size(block),
                       o.get_fraction * 100, (1 - o.get_fraction) * 100);
    const zipf_ranks z(2 * br.slots, o.zipf);
    const std::uint64_t written0 = store->stats().bytes_written;
    phase p = run_threads("mix", o.threads, o.seconds, o.seed + 2, [&](unsigned th, tally& t, std::mt19937_64& rng) {
      std::uniform_real_distribution<double> u(0, 1);
      auto ids = distinct(k, [&] { return mix_base + z(u(rng)); });
      if (u(rng) < o.get_fraction) {
        call.get(th, t, ids);
      } else {
        call.put(th, t, ids);
      }
      return true;
    }, drain);
    const double written = static_cast<double>(store->stats().bytes_written - written0);
    p.extra["hit_ratio"] = p.hits + p.misses > 0 ? static_cast<double>(p.hits) / static_cast<double>(p.hits + p.misses) : 0.0;
    p.extra["bytes_written_per_hit"] = p.hits > 0 ? written / static_cast<double>(p.hits) : 0.0;
    p.extra["bytes_written"] = written;
    check_capacity();
    br.phases.push_back(p);
  }

  if (wants(o, "churn")) {
    err << fmt::format("gdskit bench kv: {} blocks: churn at full capacity...\n", format_size(block));
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      while (sampling) {
        check_capacity();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    std::atomic<std::uint64_t> id{churn_base};
    const std::uint64_t ev0 = store->stats().evictions;
    phase p = run_threads("churn", o.threads, o.seconds, o.seed + 3, [&](unsigned th, tally& t, std::mt19937_64&) {
      const std::uint64_t first = id.fetch_add(k);
      std::vector<std::uint64_t> ids;
      for (unsigned j = 0; j < k; ++j) ids.push_back(first + j);
      call.put(th, t, ids);
      return true;
    }, drain);
    sampling = false;
    sampler.join();
    p.raw_gib_s = br.raw.write_gib_s;
    p.extra["evictions"] = store->stats().evictions - ev0;
    // The newest blocks are there and right.
    const std::uint64_t last = id.load();
    tally check;
    for (std::uint64_t first = last > 2 * k * o.threads ? last - 2 * k * o.threads : churn_base; first < last; first += k) {
      std::vector<std::uint64_t> ids;
      for (std::uint64_t x = first; x < std::min(last, first + k); ++x) ids.push_back(x);
      call.get(0, check, ids);
    }
    call.drain(0, check);
    p.wrong += check.wrong;
    p.extra["newest_blocks_held"] = check.hits;
    p.extra["newest_blocks_checked"] = check.hits + check.misses;
    check_capacity();
    br.phases.push_back(p);
  }

  if (wants(o, "faults")) {
    err << fmt::format("gdskit bench kv: {} blocks: faults...\n", format_size(block));
    store->close();
    auto fo = so;
    fo.deadline = std::chrono::milliseconds(500);
    store = std::make_unique<kv::block_store>(fo);
    caller fcall(*store, block, k, o.threads, 1, o.gpu, fo.deadline);  // blocking calls: each timed on its own
    std::set<ino_t> inodes;
    for (const auto& d : dirs) {
      struct stat sst {};
      if (::stat((d / "gdskit-kv.data").c_str(), &sst) == 0) inodes.insert(sst.st_ino);
    }
    // Blocks known to be held (churn may have pushed out the put storm's), read once so that S3-FIFO keeps them.
    const std::uint64_t known = std::max<std::uint64_t>(1, std::min<std::uint64_t>(br.slots / 2, 64 * k));
    {
      tally t;
      for (std::uint64_t first = 0; first < known; first += k) {
        std::vector<std::uint64_t> ids;
        for (std::uint64_t x = first; x < std::min(known, first + k); ++x) ids.push_back(fault_base + x);
        fcall.put(0, t, ids);
        fcall.get(0, t, ids);
      }
    }
    nlohmann::json fj;
    {
      fault_seam seam(inodes, std::chrono::milliseconds(2000));
      std::atomic<std::uint64_t> fid{fault_base + known};
      auto put_new = [&](unsigned th, tally& t, std::mt19937_64&) {
        std::vector<std::uint64_t> ids;
        const std::uint64_t first = fid.fetch_add(k);
        for (unsigned j = 0; j < k; ++j) ids.push_back(first + j);
        fcall.put(th, t, ids);
        return true;
      };
      auto get_old = [&](unsigned th, tally& t, std::mt19937_64& rng) {
        fcall.get(th, t, distinct(static_cast<unsigned>(std::min<std::uint64_t>(k, known)),
                                  [&] { return fault_base + rng() % known; }));
        return true;
      };
      seam.set(fault_seam::kind::enospc_writes);
      phase a = run_threads("ENOSPC puts", o.threads, 1.0, o.seed + 4, put_new);
      phase a2 = run_threads("gets while full", o.threads, 1.0, o.seed + 5, get_old);
      seam.set(fault_seam::kind::eio_reads);
      phase b = run_threads("EIO gets", o.threads, 1.0, o.seed + 6, get_old);
      seam.set(fault_seam::kind::slow);
      phase c = run_threads("slow device", o.threads, std::max(2.0, o.seconds), o.seed + 7,
                            [&](unsigned th, tally& t, std::mt19937_64& rng) {
                              return (rng() % 2 == 0) ? get_old(th, t, rng) : put_new(th, t, rng);
                            });
      seam.set(fault_seam::kind::none);
      wait_quiet(*store, 10);  // the seam may only go once no request runs through it
      phase d = run_threads("after faults", o.threads, 1.0, o.seed + 8, get_old);
      wait_quiet(*store, 10);
      auto brief = [](const phase& p) {
        return nlohmann::json{{"calls", p.calls}, {"keys", p.keys}, {"stored", p.stored}, {"failed", p.failed},
                              {"hits", p.hits}, {"misses", p.misses}, {"wrong_bytes", p.wrong}, {"hangs", p.hangs},
                              {"max_ms", p.latency.max_us / 1e3}, {"p99_ms", p.latency.p99_us / 1e3}};
      };
      fj = {{"deadline_ms", 500},
            {"slow_sleep_ms", 2000},
            {"enospc_puts", brief(a)},
            {"gets_while_full", brief(a2)},
            {"eio_gets", brief(b)},
            {"slow_device", brief(c)},
            {"gets_after", brief(d)}};
      br.faults = fj;
      phase f;
      f.name = "faults";
      for (const phase* x : {&a, &a2, &b, &c, &d}) {
        f.wrong += x->wrong;
        f.hangs += x->hangs;
        f.calls += x->calls;
      }
      f.latency = c.latency;
      f.extra = fj;
      // The store wrote nothing while the disk was full, and served old blocks all along.
      if (a.stored != 0) f.extra["note"] = "a put reported success while every write failed";
      br.phases.push_back(f);
    }
    check_capacity();
    store->close();
    store = std::make_unique<kv::block_store>(so);
  }

  if (wants(o, "crash")) {
    err << fmt::format("gdskit bench kv: {} blocks: kill -9 and reopen...\n", format_size(block));
    store->close();
    store.reset();
    nlohmann::json kills = nlohmann::json::array();
    std::uint64_t wrong = 0, hangs = 0;
    std::mt19937_64 rng(o.seed + 9);
    std::vector<std::uint64_t> reached;
    double checkpoint_ms = 0, scan_ms = 0;
    for (unsigned i = 0; i < o.kills; ++i) {
      const fs::path progress = o.dirs.front() / "gdskit-kv-bench-progress";
      const std::uint64_t start = reached.empty() ? 0 : reached.back();
      {
        std::ofstream f(progress, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(&start), sizeof start);
      }
      const pid_t pid = spawn_writer(ob, block, progress);
      interrupt_cleanup::writer(pid);
      // Once the writer is under way, a random moment later.
      const auto t0 = clock_type::now();
      while (read_progress(progress) < start + 2 * k && seconds_since(t0) < 30) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 900));
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      interrupt_cleanup::writer(0);
      const std::uint64_t upto = std::max(start, read_progress(progress));
      std::error_code ec;
      fs::remove(progress, ec);
      reached.push_back(upto);

      auto scan = so;
      scan.ignore_checkpoint = true;
      { kv::block_store full(scan); scan_ms = full.stats().recovery.seconds * 1e3; }
      kv::block_store s(so);
      const kv::store_stats rs = s.stats();
      checkpoint_ms = rs.recovery.seconds * 1e3;
      // Every key the writer may have put, and the put storm's: the right bytes or a miss.
      caller c(s, block, k, 1, 1, -1, so.deadline);
      tally t;
      for (const std::uint64_t base : {crash_base, std::uint64_t{0}}) {
        const std::uint64_t n = base == 0 ? filled : upto;
        for (std::uint64_t first = 0; first < n; first += k) {
          std::vector<std::uint64_t> ids;
          for (std::uint64_t x = first; x < std::min(n, first + k); ++x) ids.push_back(base + x);
          c.get(0, t, ids);
        }
      }
      wrong += t.wrong;
      hangs += t.hangs;
      const bool kept = rs.physical_bytes <= o.capacity_bytes && rs.blocks <= rs.slots;
      br.capacity_kept = br.capacity_kept && kept;
      br.max_physical = std::max(br.max_physical, rs.physical_bytes);
      kills.push_back({{"writer_reached", upto},
                       {"reopen_ms", checkpoint_ms},
                       {"reopen_from_checkpoint", rs.recovery.from_checkpoint},
                       {"headers_read", rs.recovery.headers_read},
                       {"full_scan_ms", scan_ms},
                       {"blocks", rs.recovery.blocks},
                       {"hits", t.hits},
                       {"wrong_bytes", t.wrong},
                       {"capacity_kept", kept}});
    }
    const double capacity_gib = static_cast<double>(o.capacity_bytes) / gib;
    br.crash = {{"kills", kills},
                {"reopen_ms_per_gib", checkpoint_ms / capacity_gib},
                {"full_scan_ms_per_gib", scan_ms / capacity_gib},
                {"wrong_bytes", wrong},
                {"hangs", hangs}};
    phase p;
    p.name = "kill -9 + reopen";
    p.wrong = wrong;
    p.hangs = hangs;
    p.extra = br.crash;
    br.phases.push_back(p);
    store = std::make_unique<kv::block_store>(so);
  }
  store->close();
  store.reset();
  if (!o.keep) remove_all(dirs);  // the baseline's files take the room the store had

  if (wants(o, "baseline")) {
    err << fmt::format("gdskit bench kv: {} blocks: baseline (a file per block, temporary name + rename)...\n",
                       format_size(block));
    for (const auto& d : files) fs::create_directories(d);
    phase put = baseline_puts(ob, block, k, br.slots, files);
    put.raw_gib_s = br.raw.fresh_write_gib_s;
    // The baseline's writes end in the page cache (its files are never synced), the store's on the device: the
    // time its dirty pages then take to reach the device says what its puts sustain once the cache is full.
    const double writeback_s = sync_folders(files);
    put.extra["writeback_seconds"] = writeback_s;
    put.extra["gib_per_s_with_writeback"] =
        put.seconds + writeback_s > 0 ? static_cast<double>(put.bytes) / gib / (put.seconds + writeback_s) : 0.0;
    drop_files(files);
    phase get = baseline_gets(ob, block, k, br.slots, files);
    get.raw_gib_s = br.raw.read_gib_s;
    br.phases.push_back(put);
    br.phases.push_back(get);
  }
  if (!o.keep) remove_all(files);
  return br;
}

// ---- report ----

std::string ms(double us) { return fmt::format("{:.2f}", us / 1e3); }

const phase* find(const block_run& br, const std::string& name) {
  for (const auto& p : br.phases) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

nlohmann::json phase_json(const phase& p) {
  nlohmann::json j = {{"name", p.name},
                      {"seconds", p.seconds},
                      {"bytes", p.bytes},
                      {"gib_per_s", p.gib_s()},
                      {"of_raw", p.raw_gib_s && *p.raw_gib_s > 0 ? nlohmann::json(p.gib_s() / *p.raw_gib_s) : nlohmann::json(nullptr)},
                      {"calls", p.calls},
                      {"keys", p.keys},
                      {"hits", p.hits},
                      {"misses", p.misses},
                      {"stored", p.stored},
                      {"failed", p.failed},
                      {"wrong_bytes", p.wrong},
                      {"hangs", p.hangs},
                      {"cpu_s_per_gib", p.cpu_per_gib()},
                      {"latency_ms", {{"p50", p.latency.p50_us / 1e3}, {"p99", p.latency.p99_us / 1e3},
                                      {"p999", p.latency.p999_us / 1e3}, {"max", p.latency.max_us / 1e3}}}};
  for (auto it = p.extra.begin(); it != p.extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

void print_text(const kv_options& o, const std::vector<block_run>& runs, std::ostream& out) {
  std::string dirs;
  for (const auto& d : o.dirs) dirs += (dirs.empty() ? "" : ", ") + printable(d.string());
  const auto count = [](unsigned n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); };
  out << fmt::format("gdskit bench kv: {}; capacity {}; {} memory; {}, {} in flight each (the baseline: {}); "
                     "durability {}\n",
                     dirs, format_size(o.capacity_bytes), o.gpu >= 0 ? fmt::format("GPU {}", o.gpu) : std::string("host"),
                     count(o.threads, "caller", "callers"), count(o.in_flight, "call", "calls"),
                     count(o.threads * o.in_flight, "caller", "callers"), kv::to_string(o.mode));
  for (const auto& br : runs) {
    out << fmt::format("\nblock {} ({} per call, {} slots); files: {}\n", format_size(br.block), br.batch, br.slots,
                       br.direct ? "O_DIRECT" : printable(br.direct_reason));
    out << fmt::format("  raw device: write {:.2f} GiB/s into new blocks, {:.2f} GiB/s over written ones, read {:.2f} "
                       "GiB/s (each the best of 8, 16 and 64 requests in flight: {}, {} and {}{}){}\n",
                       br.raw.fresh_write_gib_s, br.raw.write_gib_s, br.raw.read_gib_s, br.raw.fresh_write_depth,
                       br.raw.write_depth, br.raw.read_depth, br.raw.direct ? "; O_DIRECT" : "",
                       br.raw.note.empty() ? "" : "; " + br.raw.note);
    out << fmt::format("  {:<18} {:>7} {:>6} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>5}\n", "phase", "GiB/s", "of raw",
                       "p50 ms", "p99 ms", "p99.9 ms", "CPU-s/GiB", "hits", "wrong", "hangs");
    for (const auto& p : br.phases) {
      if (p.name == "faults" || p.name == "kill -9 + reopen") continue;
      out << fmt::format("  {:<18} {:>7.2f} {:>6} {:>8} {:>8} {:>9} {:>9.2f} {:>7} {:>6} {:>5}\n", p.name, p.gib_s(),
                         p.raw_gib_s && *p.raw_gib_s > 0 ? fmt::format("{:.2f}", p.gib_s() / *p.raw_gib_s) : "-",
                         ms(p.latency.p50_us), ms(p.latency.p99_us), ms(p.latency.p999_us), p.cpu_per_gib(),
                         p.hits, p.wrong, p.hangs);
    }
    std::string failed;
    for (const auto& p : br.phases) {
      if (p.failed > 0) failed += fmt::format("{}{} {}", failed.empty() ? "" : ", ", p.name, p.failed);
    }
    if (!failed.empty()) out << fmt::format("  keys whose puts failed (ENOSPC, EIO or the deadline): {}\n", failed);
    if (const phase* m = find(br, "mix")) {
      out << fmt::format("  mix: hit ratio {:.2f}, {:.2f} block(s) written per hit\n", m->extra.value("hit_ratio", 0.0),
                         m->extra.value("bytes_written_per_hit", 0.0) / static_cast<double>(br.block));
    }
    const phase* sp = find(br, "put storm");
    const phase* sg = find(br, "cold get");
    const phase* bp = find(br, "baseline put");
    const phase* bg = find(br, "baseline get");
    if (sp && bp && bp->gib_s() > 0) out << fmt::format("  store / baseline: put {:.1f}x", sp->gib_s() / bp->gib_s());
    if (sg && bg && bg->gib_s() > 0) out << fmt::format(", get {:.1f}x", sg->gib_s() / bg->gib_s());
    if (sp && bp) out << "\n";
    if (bp != nullptr && bp->extra.contains("writeback_seconds")) {
      const double with = bp->extra["gib_per_s_with_writeback"].get<double>();
      out << fmt::format("  baseline puts with their writeback ({:.2f} s to sync after the phase): {:.2f} GiB/s",
                         bp->extra["writeback_seconds"].get<double>(), with);
      if (sp != nullptr && with > 0) out << fmt::format("; store / baseline {:.1f}x", sp->gib_s() / with);
      out << "\n";
    }
    if (!br.crash.is_null()) {
      const auto& c = br.crash;
      out << fmt::format("  kill -9 x{}: reopen {:.1f} ms/GiB of capacity (checkpoint), {:.1f} ms/GiB reading every "
                         "header; wrong bytes {}, hangs {}\n",
                         c["kills"].size(), c["reopen_ms_per_gib"].get<double>(), c["full_scan_ms_per_gib"].get<double>(),
                         c["wrong_bytes"].get<std::uint64_t>(), c["hangs"].get<std::uint64_t>());
    }
    if (!br.faults.is_null()) {
      const auto& f = br.faults;
      out << fmt::format("  faults (deadline {} ms): ENOSPC puts stored {}/{}; gets while full {} hits; EIO gets {} hits;"
                         " slow device max {:.0f} ms, hangs {}; after: {} hits; wrong bytes {}\n",
                         f["deadline_ms"].get<int>(), f["enospc_puts"]["stored"].get<std::uint64_t>(),
                         f["enospc_puts"]["keys"].get<std::uint64_t>(), f["gets_while_full"]["hits"].get<std::uint64_t>(),
                         f["eio_gets"]["hits"].get<std::uint64_t>(), f["slow_device"]["max_ms"].get<double>(),
                         f["slow_device"]["hangs"].get<std::uint64_t>(), f["gets_after"]["hits"].get<std::uint64_t>(),
                         f["enospc_puts"]["wrong_bytes"].get<std::uint64_t>() + f["gets_while_full"]["wrong_bytes"].get<std::uint64_t>() +
                             f["eio_gets"]["wrong_bytes"].get<std::uint64_t>() + f["slow_device"]["wrong_bytes"].get<std::uint64_t>() +
                             f["gets_after"]["wrong_bytes"].get<std::uint64_t>());
    }
    out << fmt::format("  capacity: at most {} of {} on disk{}\n", format_size(br.max_physical),
                       format_size(o.capacity_bytes), br.capacity_kept ? "" : " -- EXCEEDED");
    out << fmt::format("  path: {}\n", printable(br.path_note));
  }
}

}  // namespace

int run_kv(const std::function<kv_options()>& make_options, std::ostream& out, std::ostream& err) {
  kv_options o;
  try {
    o = make_options();
  } catch (const usage_error& e) {
    err << "gdskit bench kv: " << printable(e.what()) << "\n";
    return 2;
  }
  // A bad GDSKIT_* setting is bad input, as for every other command; not a failure during the run.
  if (settings_refused(err, "gdskit bench kv")) return 2;
  try {
    // A benchmark changes no later run: it neither starts from learned shapes nor writes them.
    set_setting("learn", "off");
    if (!o.crash_child_progress.empty()) return crash_child(o);
    interrupt_cleanup::arm(o);
    if (o.gpu >= 0) {
      std::string why;
      if (!gpu_available(&why)) {
        err << "gdskit bench kv: --gpu " << o.gpu << ": no usable GPU: " << printable(why) << "\n";
        return 2;
      }
    }
    std::vector<block_run> runs;
    for (std::size_t b : o.block_bytes) runs.push_back(run_block(o, b, err));
    bool ok = true;
    for (const auto& br : runs) {
      ok = ok && br.capacity_kept;
      for (const auto& p : br.phases) ok = ok && p.wrong == 0 && p.hangs == 0;
    }
    if (o.json) {
      nlohmann::json j = {{"gdskit_bench_kv", 1},
                          {"dirs", nlohmann::json::array()},
                          {"capacity_bytes", o.capacity_bytes},
                          {"threads", o.threads},
                          {"in_flight", o.in_flight},
                          {"memory", o.gpu >= 0 ? fmt::format("cuda:{}", o.gpu) : std::string("host")},
                          {"durability", std::string(kv::to_string(o.mode))},
                          {"ok", ok},
                          {"runs", nlohmann::json::array()}};
      for (const auto& d : o.dirs) j["dirs"].push_back(d.string());
      for (const auto& br : runs) {
        nlohmann::json r = {{"block_bytes", br.block},
                            {"batch", br.batch},
                            {"slots", br.slots},
                            {"direct", br.direct},
                            {"direct_reason", br.direct_reason},
                            {"path", br.path_note},
                            {"raw", {{"fresh_write_gib_per_s", br.raw.fresh_write_gib_s},
                                     {"write_gib_per_s", br.raw.write_gib_s},
                                     {"read_gib_per_s", br.raw.read_gib_s},
                                     {"fresh_write_depth", br.raw.fresh_write_depth},
                                     {"write_depth", br.raw.write_depth},
                                     {"read_depth", br.raw.read_depth},
                                     {"direct", br.raw.direct},
                                     {"write_p99_ms", br.raw.write_latency.p99_us / 1e3},
                                     {"read_p99_ms", br.raw.read_latency.p99_us / 1e3}}},
                            {"max_physical_bytes", br.max_physical},
                            {"capacity_kept", br.capacity_kept},
                            {"phases", nlohmann::json::array()}};
        for (const auto& p : br.phases) r["phases"].push_back(phase_json(p));
        j["runs"].push_back(r);
      }
      out << json_text(j) << "\n";
    } else {
      print_text(o, runs, out);
      out << (ok ? "\nall checks held: no wrong bytes, no hangs, capacity kept\n"
                 : "\nA CHECK FAILED: see wrong / hangs / capacity above\n");
    }
    return ok ? 0 : 1;
  } catch (const usage_error& e) {
    err << "gdskit bench kv: " << printable(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "gdskit bench kv: " << shown_message(e) << "\n";
    return 3;
  }
}

}  // namespace gdskit::bench
