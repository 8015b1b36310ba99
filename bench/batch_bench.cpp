// Random reads of many small ranges, three ways in one run, cold (O_DIRECT; the file dropped from the page cache
// before each run):
//   ring     the ceiling: one thread keeping DEPTH O_DIRECT reads in flight on a raw io_uring ring
//   ring, wide  the same ring with its reads spread over as much destination memory as one batch's ranges
//            (on a device that copies into memory, destinations out of the CPU's caches cost rate)
//   batch    gdskit: one calling thread submitting batches of many ranges at queue depth DEPTH, into host memory
//            and (where a GPU is usable) into GPU memory
//   workers  gdskit bench's way before batches: DEPTH threads, each reading one range at a time
//   batch gpu, engines  the GPU batch with its small pieces copied by the copy engines, not the copy kernel
//   peer     with --peer PROGRAM: another library's way of keeping DEPTH reads in flight into GPU memory
//            (bench/peers/kvikio_random_reads.cpp: KvikIO's pread futures over its thread pool), run as a child
//            process in the same turns, with the GPU batch's ratios against it
// Every row reads at random slots spaced more than a batch's coalescing gap apart, a batch's ranges at distinct
// slots: a batch issues the ring's reads one for one (it says so when it joined some).
// Each prints GiB/s, IOPS, per-range p50/p99/p99.9 latency and CPU-s per GiB, and the batch's ratios against the
// ring (rate, p99.9) and against the workers (CPU). With --turns N each case runs N turns of the ring and every row,
// each row's figures pool its turns, and the ratios add each turn's against that turn's ring: a device whose rate
// drifts between runs (virtual machines: 10-30%) makes one pass's ratios noisy, and the turns show by how much.
//
//   batch_bench FILE SIZE [SECONDS] [CASES] [--json OUT] [--ring-only] [--rows LIST] [--turns N]
//               [--peer PROGRAM [--peer-timeout S]]
//   CASES default "4K:64,64K:64,2M:16"
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ceilings.hpp"
#include "common/printable.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/settings.hpp"

using namespace gdskit;
using namespace gdskit::bench_support;

namespace {

// What one run measured, kept raw so that several turns of a row pool into one before anything is summarized.
struct sample {
  std::size_t nbytes = 0, ops = 0;
  std::size_t requests = 0;  // the requests a batch made for its ops; 0 where not counted (the ring's are ops)
  double seconds = 0, cpu_seconds = 0;
  std::vector<double> latencies_s;
  bool ok = true;
};

// One row of a case: how to measure it once, and its turns so far.
struct planned_row {
  std::string what;
  std::function<sample()> measure;
  sample pooled;
  std::vector<double> turn_gib_s;
};

struct result {
  std::string what;
  double gib_s = 0, iops = 0, p50_us = 0, p99_us = 0, p999_us = 0, cpu_s_per_gib = 0;
  double requests_per_op = 0;  // 0: not counted
  std::vector<double> turn_gib_s;
  bool ok = true;
};

double gib(std::size_t nbytes) { return static_cast<double>(nbytes) / (1u << 30); }

double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k] * 1e6;
}

void add_turn(planned_row& r, sample s) {
  r.turn_gib_s.push_back(s.seconds > 0 ? gib(s.nbytes) / s.seconds : 0);
  sample& p = r.pooled;
  p.nbytes += s.nbytes;
  p.ops += s.ops;
  p.requests += s.requests;
  p.seconds += s.seconds;
  p.cpu_seconds += s.cpu_seconds;
  // Moved, not copied, when it is the first: one turn costs no more memory than before turns.
  if (p.latencies_s.empty()) {
    p.latencies_s = std::move(s.latencies_s);
  } else {
    p.latencies_s.insert(p.latencies_s.end(), s.latencies_s.begin(), s.latencies_s.end());
  }
  p.ok = p.ok && s.ok;
}

// Pooled figures: total bytes over total seconds, not the mean of the turns' rates, so that each turn weighs by
// its time as one long run's parts would.
result summarize(planned_row& r) {
  sample& p = r.pooled;
  result out;
  out.what = r.what;
  out.gib_s = p.seconds > 0 ? gib(p.nbytes) / p.seconds : 0;  // 0 s: a run that failed before it measured
  out.iops = p.seconds > 0 ? static_cast<double>(p.ops) / p.seconds : 0;
  out.p50_us = pct(p.latencies_s, 0.5);
  out.p99_us = pct(p.latencies_s, 0.99);
  out.p999_us = pct(p.latencies_s, 0.999);
  out.cpu_s_per_gib = p.nbytes > 0 ? p.cpu_seconds / gib(p.nbytes) : 0;
  out.requests_per_op = p.ops > 0 ? static_cast<double>(p.requests) / static_cast<double>(p.ops) : 0;
  out.turn_gib_s = r.turn_gib_s;
  out.ok = p.ok;
  return out;
}

// Ranges per batch for a case: enough that the queue stays full for nearly all of each batch.
std::size_t ranges_per_batch(std::size_t io, unsigned depth) {
  return std::max<std::size_t>(depth * std::size_t{64}, std::min<std::size_t>(65536, (std::size_t{256} << 20) / io));
}

// Room left after each range of `io` bytes: more than a batch's coalescing gap, so that no two ranges of one
// batch are near enough to be joined into one request, and a multiple of `io`, so that ranges stay aligned to
// their size as in a file of blocks (a range then never straddles a request-size boundary it would not have).
std::uint64_t range_stride(std::size_t io) {
  const std::size_t gap = batch_options{}.coalesce_gap_bytes + 4096;
  return io + (gap + io - 1) / io * io;
}

// Slots for ranges of `io` bytes in a file of `file_size`.
std::uint64_t range_slots(std::uint64_t file_size, std::size_t io) {
  return std::max<std::uint64_t>(1, file_size / range_stride(io));
}

// Offsets of about `count` reads of `io` bytes (a whole number of windows): slots of range_stride(io) bytes,
// each window of `window` consecutive reads (a batch's ranges) at distinct slots. A batch then issues exactly
// the reads the ring does, one request per range, never one read for two ranges: each row moves every byte it
// counts. A file with fewer slots than a window (a small file) repeats slots from one window to the next.
std::vector<std::uint64_t> offsets_for(std::uint64_t file_size, std::size_t io, std::size_t window, std::size_t count,
                                       std::uint64_t seed) {
  const std::uint64_t stride = range_stride(io), slots = range_slots(file_size, io);
  window = static_cast<std::size_t>(std::min<std::uint64_t>(window, slots));
  const std::size_t n = window * std::max<std::size_t>(1, count / window);
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> pool(static_cast<std::size_t>(slots));
  for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = i;
  std::vector<std::uint64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    // A partial shuffle per window: its k-th read takes one of the slots it has not taken yet.
    const std::size_t k = i % window;
    std::swap(pool[k], pool[k + static_cast<std::size_t>(rng() % (slots - k))]);
    out[i] = pool[k] * stride;
  }
  return out;
}

// `footprint`: bytes of destination memory the reads rotate through (0: one slot per request in flight, the
// classic ceiling whose destinations stay in the CPU's caches).
sample raw_ring(const std::filesystem::path& path, std::uint64_t size, std::size_t io, unsigned depth, double seconds,
                std::size_t footprint = 0) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    std::perror("open O_DIRECT");
    std::exit(2);
  }
  // Set up as the batch driver's rings are (one thread submits and reaps; completions run when it asks for
  // them), where the kernel has it (6.1 and later): the ceiling is the best a ring of one thread does.
  io_uring ring{};
  io_uring_params params{};
  params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
  if (io_uring_queue_init_params(depth, &ring, &params) != 0 && io_uring_queue_init(depth, &ring, 0) != 0) {
    std::fprintf(stderr, "io_uring_queue_init failed\n");
    std::exit(2);
  }
  const std::size_t slots = std::max<std::size_t>(depth, footprint / io);
  std::byte* mem = static_cast<std::byte*>(std::aligned_alloc(4096, io * slots));
  std::memset(mem, 0, io * slots);  // touched, as the batch's destinations are
  std::size_t cursor = 0;
  const auto offs = offsets_for(size, io, ranges_per_batch(io, depth), std::size_t{1} << 22, 11);
  std::vector<double> start(depth), lat;
  lat.reserve(1 << 20);
  std::size_t next = 0, bytes = 0, ops = 0;
  auto submit = [&](unsigned slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    std::byte* dst = slots == depth ? mem + slot * io : mem + (cursor++ % slots) * io;
    io_uring_prep_read(sqe, fd, dst, static_cast<unsigned>(io), offs[next++ % offs.size()]);
    io_uring_sqe_set_data64(sqe, slot);
    start[slot] = now_s();
  };
  const double c0 = cpu_s(), t0 = now_s();
  for (unsigned s = 0; s < depth; ++s) submit(s);
  unsigned inflight = depth;
  bool stopping = false;
  while (inflight > 0) {
    io_uring_submit_and_wait(&ring, 1);
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      const unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      if (cqe->res != static_cast<int>(io)) {
        std::fprintf(stderr, "raw read: %d\n", cqe->res);
        std::exit(2);
      }
      io_uring_cqe_seen(&ring, cqe);
      const double t = now_s();
      lat.push_back(t - start[slot]);
      bytes += io;
      ++ops;
      --inflight;
      if (!stopping && t - t0 >= seconds) stopping = true;
      if (!stopping) {
        submit(slot);
        ++inflight;
      }
    }
  }
  const double dt = now_s() - t0, cpu = cpu_s() - c0;
  io_uring_queue_exit(&ring);
  std::free(mem);
  ::close(fd);
  return {bytes, ops, 0, dt, cpu, std::move(lat), true};
}

// Batches of `per_batch` ranges, one after another, at queue depth `depth`, into distinct slices of `dst`.
sample batches(const std::filesystem::path& path, std::uint64_t size, std::size_t io, unsigned depth, double seconds,
               buffer_view dst) {
  gdskit::file_handle f(path, open_mode::read);
  const std::size_t per_batch = dst.nbytes / io;
  const auto offs = offsets_for(size, io, per_batch, std::size_t{1} << 22, 12);
  std::vector<io_range> ranges(per_batch);
  batch_options o;
  o.queue_depth = depth;
  o.exact = true;
  std::vector<double> lat;
  std::size_t bytes = 0, ops = 0, next = 0, requests = 0;
  bool ok = true;
  const double c0 = cpu_s(), t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (std::size_t k = 0; k < per_batch; ++k) ranges[k] = {&f, offs[next++ % offs.size()], dst.sub(k * io, io)};
    const batch_result r = read_batch(ranges, o);
    ok = ok && r.ok();
    bytes += r.nbytes;
    ops += r.ranges.size();
    requests += r.routes.requests;
    for (const auto& x : r.ranges) lat.push_back(x.latency_s);
  }
  const double dt = now_s() - t0, cpu = cpu_s() - c0;
  // Ranges a batch joined into one request are reads the ring made and the batch did not: said, so that no
  // ratio hides them.
  // More requests than ranges are said as well (ranges cut at the device's request size, or a joined request
  // retried range by range): the ring reads each range with one.
  if (requests != ops) {
    std::fprintf(stderr, "batch_bench: note: the batch read %zu ranges of %zu bytes with %zu requests (%s)\n", ops, io,
                 requests, requests < ops ? "some joined" : "some cut into several or retried");
  }
  return {bytes, ops, requests, dt, cpu, std::move(lat), ok};
}

// `depth` threads, each reading one range at a time with file_handle::read into its own slice of `dst`.
sample workers(const std::filesystem::path& path, std::uint64_t size, std::size_t io, unsigned depth, double seconds,
               buffer_view dst) {
  gdskit::file_handle f(path, open_mode::read);
  std::atomic<std::size_t> bytes{0}, ops{0};
  std::vector<std::vector<double>> lats(depth);
  std::atomic<bool> failed{false};
  // Each worker's offsets, drawn before the clock starts.
  std::vector<std::vector<std::uint64_t>> offsets(depth);
  for (unsigned w = 0; w < depth; ++w) {
    offsets[w] = offsets_for(size, io, ranges_per_batch(io, depth), std::size_t{1} << 16, 100 + w);
  }
  const double c0 = cpu_s(), t0 = now_s();
  std::vector<std::thread> ts;
  for (unsigned w = 0; w < depth; ++w) {
    ts.emplace_back([&, w] {
      const auto& offs = offsets[w];
      std::size_t k = 0;
      const buffer_view mine = dst.sub(w * io, io);
      while (now_s() - t0 < seconds) {
        const double s = now_s();
        try {
          if (f.read(mine, io, offs[k++ % offs.size()]) != io) failed = true;
        } catch (const std::exception&) {
          failed = true;
        }
        lats[w].push_back(now_s() - s);
        bytes += io;
        ++ops;
      }
    });
  }
  for (auto& t : ts) t.join();
  const double dt = now_s() - t0, cpu = cpu_s() - c0;
  std::vector<double> lat;
  for (auto& l : lats) lat.insert(lat.end(), l.begin(), l.end());
  return {bytes.load(), ops.load(), 0, dt, cpu, std::move(lat), !failed};
}

// One run of a peer program: `PROGRAM FILE IO DEPTH SECONDS` prints a JSON line (what, nbytes, ops, seconds,
// cpu_seconds: its own measured loop, set-up excluded) and then one latency in seconds per read. The program is
// run without a shell and its output is checked like any file's: a peer that fails, or prints anything else,
// makes a row marked ERRORS, never a figure.
sample peer_run(const std::string& program, std::string& what, const std::filesystem::path& path, std::size_t io,
                unsigned depth, double seconds, double timeout_s) {
  sample out;
  out.ok = false;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return out;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  const std::string io_s = std::to_string(io), depth_s = std::to_string(depth), seconds_s = std::to_string(seconds);
  std::vector<char*> args = {const_cast<char*>(program.c_str()), const_cast<char*>(path.c_str()),
                             const_cast<char*>(io_s.c_str()), const_cast<char*>(depth_s.c_str()),
                             const_cast<char*>(seconds_s.c_str()), nullptr};
  // Its own process group: a peer that is a script stops with everything it started.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, program.c_str(), &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    std::fprintf(stderr, "batch_bench: --peer %s: %s\n", printable(program).c_str(), std::strerror(spawned));
    return out;
  }
  // The peer gets until the deadline to print and exit, and a bounded output: a latency line is about 12 bytes,
  // so 48 MiB per second of its run is some four million reads a second (at least 256 MiB, at most 4 GiB). Past
  // either it is stopped and its row refused.
  const std::size_t output_max = static_cast<std::size_t>(
      std::clamp(seconds * double(48 << 20), double(std::size_t{256} << 20), double(std::size_t{4} << 30)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const auto past_deadline = [&] { return std::chrono::steady_clock::now() >= deadline; };
  const auto ms_left = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1000));
  };
  const std::string late = "did not finish within --peer-timeout (" + std::to_string(std::lround(timeout_s)) + " s)";
  std::string text;
  std::string stopped;  // why the peer was stopped, if it was
  try {
    for (char chunk[1 << 16];;) {
      if (past_deadline()) {
        stopped = late;
        break;
      }
      pollfd p{fds[0], POLLIN, 0};
      const int ready = ::poll(&p, 1, ms_left());
      if (ready < 0 && errno != EINTR) {
        stopped = std::string("output could not be read: ") + std::strerror(errno);
        break;
      }
      if (ready <= 0) continue;
      const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        stopped = std::string("output could not be read: ") + std::strerror(errno);
        break;
      }
      if (text.size() + static_cast<std::size_t>(n) > output_max) {
        stopped = "printed more than " + format_size(output_max);
        break;
      }
      text.append(chunk, static_cast<std::size_t>(n));
    }
  } catch (const std::bad_alloc&) {
    stopped = "printed more than this process could hold";
  }
  ::close(fds[0]);
  int status = 0;
  // Its output ended (or it was stopped): it gets what is left of the deadline to exit.
  for (;;) {
    if (!stopped.empty()) ::kill(-pid, SIGKILL);
    const pid_t got = ::waitpid(pid, &status, stopped.empty() ? WNOHANG : 0);
    if (got == pid) break;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      // Not ours to reap (SIGCHLD ignored by whoever started this process): its exit status is unknown.
      if (stopped.empty()) stopped = std::string("exit status unknown: ") + std::strerror(errno);
      break;
    }
    if (past_deadline() && stopped.empty()) stopped = late;
    if (stopped.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!stopped.empty()) {
    std::fprintf(stderr, "batch_bench: --peer %s %s; stopped, its row refused\n", printable(program).c_str(),
                 stopped.c_str());
    return out;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "batch_bench: --peer %s failed (status %d)\n", printable(program).c_str(), status);
    return out;
  }
  // A summary is a few hundred bytes: a longer first line is refused before it is parsed (nesting in it would
  // recurse in the parser).
  const std::size_t eol = text.find('\n');
  constexpr std::size_t k_summary_max = 4096;
  const auto head = std::min(eol, text.size()) <= k_summary_max ? nlohmann::json::parse(text.substr(0, eol), nullptr, false)
                                                                : nlohmann::json();
  const auto number = [&](const char* key) -> std::optional<double> {
    if (!head.is_object() || !head.contains(key) || !head[key].is_number()) return std::nullopt;
    const double v = head[key].get<double>();
    return std::isfinite(v) && v >= 0 ? std::optional<double>(v) : std::nullopt;
  };
  const auto nbytes = number("nbytes"), ops = number("ops"), secs = number("seconds"), cpu = number("cpu_seconds");
  // Its name becomes a row's name, printed and written into --json as it is: letters, digits and . _ + - only.
  const auto name_ok = [&] {
    if (!head.is_object() || !head.contains("what") || !head["what"].is_string()) return false;
    const std::string& n = head["what"].get_ref<const std::string&>();
    return !n.empty() && n.size() <= 32 && std::all_of(n.begin(), n.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
             c == '+' || c == '-';
    });
  };
  if (!nbytes || !ops || !secs || !cpu || *secs <= 0 || !name_ok()) {
    std::fprintf(stderr, "batch_bench: --peer %s: its first line is not the expected summary\n",
                 printable(program).c_str());
    return out;
  }
  std::vector<double> latencies;
  for (std::size_t pos = eol == std::string::npos ? text.size() : eol + 1; pos < text.size();) {
    const std::size_t next = std::min(text.find('\n', pos), text.size());
    char* end = nullptr;
    const std::string line = text.substr(pos, next - pos);
    const double v = std::strtod(line.c_str(), &end);
    if (end == line.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) {
      std::fprintf(stderr, "batch_bench: --peer %s: a latency line is not a number\n", printable(program).c_str());
      return out;
    }
    latencies.push_back(v);
    pos = next + 1;
  }
  if (latencies.size() != static_cast<std::size_t>(*ops) || static_cast<std::size_t>(*nbytes) != latencies.size() * io) {
    std::fprintf(stderr, "batch_bench: --peer %s: counts do not add up\n", printable(program).c_str());
    return out;
  }
  what = head["what"].get<std::string>() + " gpu";
  out.latencies_s = std::move(latencies);
  out.nbytes = static_cast<std::size_t>(*nbytes);
  out.ops = static_cast<std::size_t>(*ops);
  out.seconds = *secs;
  out.cpu_seconds = *cpu;
  out.ok = true;
  return out;
}

void print(const result& r) {
  std::printf("  %-16s %8.3f GiB/s %10.0f IOPS  p50 %8.1f us  p99 %8.1f us  p99.9 %8.1f us  %.3f CPU-s/GiB%s\n",
              r.what.c_str(), r.gib_s, r.iops, r.p50_us, r.p99_us, r.p999_us, r.cpu_s_per_gib, r.ok ? "" : "  ERRORS");
}

// The JSON field of a row whose requests were counted (a batch's): requests per range, 1 where each range was
// read with one request as the ring reads it.
std::string json_requests(const result& r) {
  if (r.requests_per_op <= 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, ", \"requests_per_range\": %.4f", r.requests_per_op);
  return buf;
}

// The JSON fields a row gets for its turns: how many, and each one's rate where there were several.
std::string json_turns(const result& r) {
  std::string s = ", \"turns\": " + std::to_string(r.turn_gib_s.size());
  if (r.turn_gib_s.size() < 2) return s;
  s += ", \"turn_gib_s\": [";
  for (std::size_t t = 0; t < r.turn_gib_s.size(); ++t) {
    char one[32];
    std::snprintf(one, sizeof one, "%s%.4f", t == 0 ? "" : ", ", r.turn_gib_s[t]);
    s += one;
  }
  return s + "]";
}

}  // namespace

int run(int argc, char** argv);

constexpr const char* k_rows[] = {"wide", "batch-host", "workers-host", "batch-gpu", "workers-gpu", "batch-gpu-engines"};
constexpr const char* k_row_names = "wide, batch-host, workers-host, batch-gpu, workers-gpu, batch-gpu-engines";

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_bench: %s\n", e.what());
    return 1;
  }
}

constexpr const char* k_usage =
    "usage: batch_bench FILE SIZE [SECONDS] [CASES] [--json OUT] [--ring-only] [--rows LIST] [--turns N]\n"
    "                   [--peer PROGRAM [--peer-timeout S]]\n"
    "  Cold random reads of FILE (made with random data when absent; an existing file is used only when it has\n"
    "  exactly SIZE bytes) for SECONDS each (default 6): a raw io_uring ring at each case's size and depth, the\n"
    "  ring over as much memory as a batch, then one thread's batches into host and GPU memory, with ratios.\n"
    "  CASES: SIZE:DEPTH,... (default 4K:64,64K:64,2M:16; SIZE a multiple of 4K). --json OUT writes the rows;\n"
    "  --ring-only measures the rings alone. --rows LIST measures the ring and only these rows (a profile of one\n"
    "  of them): wide, batch-host, workers-host, batch-gpu, workers-gpu, batch-gpu-engines. --turns N (1..20,\n"
    "  default 1) runs the ring and the rows N times in turn and pools each row's turns; ratios add each turn's.\n"
    "  --peer PROGRAM adds a row run as `PROGRAM FILE IO DEPTH SECONDS` in each turn (another library's reads\n"
    "  into GPU memory: bench/peers/kvikio_random_reads, built by scripts/build-kvikio-peer.sh), and the GPU\n"
    "  batch's ratios against it. A peer that runs past --peer-timeout S (default 60 + 2 x SECONDS) or prints\n"
    "  more than 48 MiB per second of SECONDS (256 MiB..4 GiB) is stopped and its row marked ERRORS.\n";

int run(int argc, char** argv) {
  const args_verdict v = check_args(argc, argv, k_usage,
                                      {"--json", "--ring-only", "--rows", "--turns", "--peer", "--peer-timeout"});
  if (v != args_verdict::run) return v == args_verdict::help ? 0 : 2;
  if (argc < 3) {
    std::fputs(k_usage, stderr);
    return 2;
  }
  const std::filesystem::path path = argv[1];
  const std::uint64_t size = parse_size(argv[2]).value_or(0);
  double seconds = 6.0;
  // SECONDS and CASES only before the first option: an option's value is never taken for them.
  int positional = 3;
  while (positional < argc && argv[positional][0] != '-') ++positional;
  if (positional > 3) {
    char* end = nullptr;
    seconds = std::strtod(argv[3], &end);
    if (end == argv[3] || *end != '\0' || !(seconds > 0 && seconds <= 3600)) seconds = 0;  // refused below
  }
  if (positional > 5) {
    std::fprintf(stderr, "batch_bench: unexpected argument '%s'\n%s", printable(argv[5]).c_str(), k_usage);
    return 2;
  }
  const std::string cases = positional > 4 ? argv[4] : "4K:64,64K:64,2M:16";
  std::string json_path;
  bool ring_only = false;
  std::string rows;  // empty: every row
  unsigned turns = 1;
  std::string peer;  // empty: no peer row
  double peer_timeout_s = 0;  // 0: 60 s more than twice SECONDS
  const auto wanted = [&](std::string_view row) {
    if (rows.empty()) return true;
    const std::string list = "," + rows + ",";
    return list.find("," + std::string(row) + ",") != std::string::npos;
  };
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--json") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "batch_bench: --json needs a file\n");
        return 2;
      }
      json_path = argv[++i];
    }
    if (std::string(argv[i]) == "--ring-only") ring_only = true;
    if (std::string(argv[i]) == "--rows") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "batch_bench: --rows needs a list\n");
        return 2;
      }
      rows = argv[++i];
      for (std::size_t pos = 0; pos <= rows.size();) {
        const std::size_t comma = std::min(rows.find(',', pos), rows.size());
        const std::string row = rows.substr(pos, comma - pos);
        if (std::find(std::begin(k_rows), std::end(k_rows), row) == std::end(k_rows)) {
          std::fprintf(stderr, "batch_bench: --rows: no row '%s' (%s)\n", printable(row).c_str(), k_row_names);
          return 2;
        }
        pos = comma + 1;
      }
    }
    if (std::string(argv[i]) == "--peer") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "batch_bench: --peer needs a program\n");
        return 2;
      }
      peer = argv[++i];
      if (::access(peer.c_str(), X_OK) != 0 || !std::filesystem::is_regular_file(peer)) {
        std::fprintf(stderr, "batch_bench: --peer %s is not an executable file\n", printable(peer).c_str());
        return 2;
      }
    }
    if (std::string(argv[i]) == "--peer-timeout") {
      const auto counted = i + 1 < argc ? parse_count(argv[i + 1], 1, 3600) : std::nullopt;
      if (!counted) {
        std::fprintf(stderr, "batch_bench: --peer-timeout needs a number of seconds from 1 to 3600\n");
        return 2;
      }
      peer_timeout_s = static_cast<double>(*counted);
      ++i;
    }
    if (std::string(argv[i]) == "--turns") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "batch_bench: --turns needs a number (1..20)\n");
        return 2;
      }
      const auto counted = parse_count(argv[++i], 1, 20);
      if (!counted) {
        std::fprintf(stderr, "batch_bench: --turns: '%s' is not a number from 1 to 20\n", printable(argv[i]).c_str());
        return 2;
      }
      turns = static_cast<unsigned>(*counted);
    }
  }
  if (size == 0 || seconds <= 0) {
    std::fprintf(stderr, "batch_bench: bad SIZE or SECONDS (SECONDS: more than 0, at most 3600)\n%s", k_usage);
    return 2;
  }
  if (peer_timeout_s == 0) peer_timeout_s = 60 + 2 * seconds;
  if (!json_path.empty() && std::filesystem::is_directory(json_path)) {
    std::fprintf(stderr, "batch_bench: --json %s is a folder\n", json_path.c_str());
    return 2;
  }
  // Every case is checked before the data file is made: a typo costs no file and no minutes of writing.
  struct bench_case {
    std::size_t io;
    unsigned depth;
    std::size_t per_batch;
  };
  std::vector<bench_case> todo;
  for (std::size_t pos = 0; pos < cases.size();) {
    const std::size_t comma = cases.find(',', pos);
    const std::string c = cases.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? cases.size() : comma + 1;
    const std::size_t colon = c.find(':');
    const std::size_t io = static_cast<std::size_t>(parse_size(c.substr(0, colon)).value_or(0));
    const auto counted = colon == std::string::npos ? std::optional<unsigned long>(64)
                                                    : parse_count(c.c_str() + colon + 1, 1, 256);
    if (io == 0 || io % 4096 != 0 || io > (std::size_t{64} << 20) || !counted) {
      std::fprintf(stderr, "batch_bench: bad case '%s' (SIZE:DEPTH, SIZE a multiple of 4K up to 64M, DEPTH 1..256)\n",
                   printable(c).c_str());
      return 2;
    }
    const auto depth = static_cast<unsigned>(*counted);
    const std::size_t per_batch = ranges_per_batch(io, depth);
    if (per_batch * io > (std::size_t{32} << 30)) {
      std::fprintf(stderr, "batch_bench: case '%s' would need %s of destinations (64 x DEPTH ranges); at most 32 GiB\n",
                   printable(c).c_str(), format_size(per_batch * io).c_str());
      return 2;
    }
    if (io > size) {
      std::fprintf(stderr, "batch_bench: case '%s' reads more than SIZE\n", printable(c).c_str());
      return 2;
    }
    if (const std::uint64_t room = range_slots(size, io); room < per_batch) {
      std::fprintf(stderr, "batch_bench: note: SIZE has room for %llu ranges of case '%s' apart, fewer than a batch's "
                           "%zu: batches repeat some (a batch into GPU memory may read a repeated range once)\n",
                   static_cast<unsigned long long>(room), printable(c).c_str(), per_batch);
    }
    todo.push_back({io, depth, per_batch});
  }
  ensure_file(path, size);
  std::string reason;
  const bool gpu = gpu_available(&reason);
  const std::string turns_note = turns > 1 ? ", " + std::to_string(turns) + " turns" : "";
  std::printf("batch_bench %s (%s), %g s per run%s, cold; GPU: %s\n", path.c_str(), format_size(size).c_str(), seconds,
              turns_note.c_str(), gpu ? "yes" : reason.c_str());
  std::FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (json != nullptr) std::fprintf(json, "[\n");
  bool first_json = true;
  for (const bench_case& c : todo) {
    const std::size_t io = c.io, per_batch = c.per_batch;
    const unsigned depth = c.depth;
    std::printf("%s random reads, depth %u (%zu ranges per batch):\n", format_size(io).c_str(), depth, per_batch);
    std::vector<planned_row> plan;
    plan.push_back({"ring", [&] { return raw_ring(path, size, io, depth, seconds); }});
    std::vector<std::byte> host;
    device_buffer d;
    if (!ring_only) {
      // The ring again, its reads spread over as much destination memory as a batch's (per_batch ranges): what a
      // device that copies into memory (a RAM loop device, a virtual disk) gives when the destinations are not in
      // the CPU's caches.
      if (wanted("wide")) {
        plan.push_back({"ring, wide", [&] { return raw_ring(path, size, io, depth, seconds, per_batch * io); }});
      }
      host.resize(per_batch * io + 4096);
      auto* aligned =
          reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(host.data()) + 4095) / 4096 * 4096);
      const buffer_view host_batch = buffer_view::host(aligned, per_batch * io);
      const buffer_view host_workers = buffer_view::host(aligned, depth * io);
      if (wanted("batch-host")) {
        plan.push_back({"batch host", [&, host_batch] { return batches(path, size, io, depth, seconds, host_batch); }});
      }
      if (wanted("workers-host")) {
        plan.push_back(
            {"workers host", [&, host_workers] { return workers(path, size, io, depth, seconds, host_workers); }});
      }
      if (gpu && (wanted("batch-gpu") || wanted("workers-gpu") || wanted("batch-gpu-engines"))) {
        d = device_buffer(per_batch * io);
        if (wanted("batch-gpu")) {
          plan.push_back({"batch gpu", [&] { return batches(path, size, io, depth, seconds, d.view()); }});
        }
        if (wanted("workers-gpu")) {
          plan.push_back({"workers gpu", [&] { return workers(path, size, io, depth, seconds, d.view()); }});
        }
        if (wanted("batch-gpu-engines")) {
          // The same batches with every piece through the copy engines instead of the copy kernel.
          plan.push_back({"batch gpu, engines", [&] {
                            set_setting("copy_kernel", "off");
                            sample s = batches(path, size, io, depth, seconds, d.view());
                            reset_setting("copy_kernel");
                            return s;
                          }});
        }
      }
    }
    std::string peer_what;  // the peer's own name for its row, from its first run
    // Not only where this process sees a GPU: the peer says for itself whether it can run.
    if (!ring_only && !peer.empty()) {
      plan.push_back({"peer gpu", [&] { return peer_run(peer, peer_what, path, io, depth, seconds, peer_timeout_s); }});
    }
    // Every turn runs the ring and then each row once, in this order, so that each turn's ratio compares a row
    // with a ring of the same turn, whatever the device's rate did between turns.
    for (unsigned turn = 0; turn < turns; ++turn) {
      for (planned_row& r : plan) {
        drop_cache(path);
        add_turn(r, r.measure());
      }
    }
    std::vector<result> rs;
    for (planned_row& r : plan) rs.push_back(summarize(r));
    const std::size_t peer_row = !ring_only && !peer.empty() ? rs.size() - 1 : rs.size();
    if (peer_row < rs.size() && !peer_what.empty()) rs[peer_row].what = peer_what;
    if (ring_only) {
      print(rs[0]);
      if (json != nullptr) {
        std::fprintf(json, "%s  {\"io\": %zu, \"depth\": %u, \"what\": \"ring\", \"gib_s\": %.4f, \"p999_us\": %.1f%s}",
                     first_json ? "" : ",\n", io, depth, rs[0].gib_s, rs[0].p999_us, json_turns(rs[0]).c_str());
        first_json = false;
      }
      continue;
    }
    for (const auto& r : rs) print(r);
    const result& ring = rs[0];
    const auto find_row = [&](const char* what) -> const result* {
      const auto it = std::find_if(rs.begin(), rs.end(), [&](const result& r) { return r.what == what; });
      return it == rs.end() ? nullptr : &*it;
    };
    const result* wide = find_row("ring, wide");
    for (const result& b : rs) {
      if (b.what.rfind("batch", 0) != 0) continue;
      const result* w = find_row(b.what.find("gpu") != std::string::npos ? "workers gpu" : "workers host");
      std::printf("  %s: %.3f of the ring's rate", b.what.c_str(), b.gib_s / ring.gib_s);
      if (wide != nullptr) std::printf(" (%.3f of the wide ring's)", b.gib_s / wide->gib_s);
      if (turns > 1) {
        std::printf(" [turns");
        for (std::size_t t = 0; t < b.turn_gib_s.size(); ++t) {
          std::printf(" %.2f", b.turn_gib_s[t] / ring.turn_gib_s[t]);
        }
        std::printf("]");
      }
      std::printf(", p99.9 %.2fx the ring's", b.p999_us / ring.p999_us);
      if (w != nullptr) std::printf(", %.3f of the workers' CPU per GiB", b.cpu_s_per_gib / w->cpu_s_per_gib);
      if (peer_row < rs.size() && b.what.find("gpu") != std::string::npos && rs[peer_row].gib_s > 0) {
        const result& q = rs[peer_row];
        std::printf("; against %s: %.3f of its rate", q.what.c_str(), b.gib_s / q.gib_s);
        if (turns > 1 && q.turn_gib_s.size() == b.turn_gib_s.size()) {
          std::printf(" [turns");
          for (std::size_t t = 0; t < b.turn_gib_s.size(); ++t) std::printf(" %.2f", b.turn_gib_s[t] / q.turn_gib_s[t]);
          std::printf("]");
        }
        std::printf(", p99.9 %.2fx its, %.3f of its CPU per GiB", b.p999_us / q.p999_us,
                    q.cpu_s_per_gib > 0 ? b.cpu_s_per_gib / q.cpu_s_per_gib : 0.0);
      }
      std::printf("\n");
    }
    if (json != nullptr) {
      for (const auto& r : rs) {
        std::fprintf(
            json,
            "%s  {\"io\": %zu, \"depth\": %u, \"what\": \"%s\", \"gib_s\": %.4f, \"iops\": %.0f, \"p50_us\": %.1f, "
            "\"p99_us\": %.1f, \"p999_us\": %.1f, \"cpu_s_per_gib\": %.4f, \"ok\": %s%s%s}",
            first_json ? "" : ",\n", io, depth, r.what.c_str(), r.gib_s, r.iops, r.p50_us, r.p99_us, r.p999_us,
            r.cpu_s_per_gib, r.ok ? "true" : "false", json_turns(r).c_str(), json_requests(r).c_str());
        first_json = false;
      }
    }
  }
  if (json != nullptr) {
    std::fprintf(json, "\n]\n");
    std::fclose(json);
  }
  return 0;
}
