// File <-> GPU memory: gdskit's staged path against the ceilings and the alternatives, all on one file in
// one run, cold and warm, read and write. Prints GiB/s, CPU-seconds per GiB and ratios against targets.
//
//   gpu_compare_bench [FILE] [SIZE] [MAX_THREADS]      (defaults: ./gdskit-gpu-bench.dat 8G 16)
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ceilings.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gpu/cuda_raii.hpp"
#include "posix/anon_memory.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/cufile.hpp"

using namespace gdskit;
using namespace gdskit::bench_support;

namespace {

struct row {
  std::string name;
  double gib_s = 0;
  double cpu_per_gib = 0;
  std::string note;
};
std::vector<row> rows;

double gib(std::uint64_t n) { return static_cast<double>(n) / (1u << 30); }

row timed(const std::string& name, std::uint64_t nbytes, const std::function<void()>& body, std::string note = {}) {
  double c0 = cpu_s(), t0 = now_s();
  body();
  double dt = now_s() - t0;
  row r{name, gib(nbytes) / dt, (cpu_s() - c0) / gib(nbytes), std::move(note)};
  rows.push_back(r);
  std::printf("  %-40s %8.2f GiB/s  %6.3f CPU-s/GiB  %s\n", r.name.c_str(), r.gib_s, r.cpu_per_gib, r.note.c_str());
  std::fflush(stdout);
  return r;
}

row failed(const std::string& name, const std::string& why) {
  row r{name, 0, 0, "unusable: " + why};
  rows.push_back(r);
  std::printf("  %-40s %8s        %s\n", name.c_str(), "-", r.note.c_str());
  return r;
}

// Pinned host -> device (and back) with 4 streams: the copy ceiling.
double copy_ceiling(const device_buffer& d, bool to_device) {
  const shim::cuda_api& a = *shim::cuda();
  const std::size_t piece = std::size_t{64} << 20;
  const unsigned nstreams = 4;
  pinned_buffer pin(piece * nstreams, d.device());
  gpu::context_guard ctx(d.device());
  // Owned: a failed copy below throws without leaking the streams.
  std::vector<gpu::cuda_stream> streams;
  for (unsigned k = 0; k < nstreams; ++k) streams.emplace_back(d.device(), shim::CU_STREAM_NON_BLOCKING);
  auto run = [&] {
    std::size_t i = 0;
    for (std::size_t off = 0; off + piece <= d.size(); off += piece, ++i) {
      auto dev = reinterpret_cast<shim::CUdeviceptr>(d.data()) + off;
      auto* host = static_cast<std::byte*>(pin.data()) + (i % nstreams) * piece;
      if (to_device) {
        shim::check_cuda(a.cuMemcpyHtoDAsync(dev, host, piece, streams[i % nstreams].get()), "cuMemcpyHtoDAsync");
      } else {
        shim::check_cuda(a.cuMemcpyDtoHAsync(host, dev, piece, streams[i % nstreams].get()), "cuMemcpyDtoHAsync");
      }
    }
    for (const auto& s : streams) shim::check_cuda(a.cuStreamSynchronize(s.get()), "cuStreamSynchronize");
  };
  run();  // warm-up
  double t0 = now_s();
  run();
  double dt = now_s() - t0;
  return gib(d.size() / piece * piece) / dt;
}

void naive_read(const std::filesystem::path& path, const device_buffer& d, std::uint64_t size) {
  const std::size_t piece = std::size_t{64} << 20;
  std::vector<char> buf(piece);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const shim::cuda_api& a = *shim::cuda();
  gpu::context_guard ctx(d.device());
  for (std::uint64_t off = 0; off < size;) {
    ssize_t r = ::read(fd, buf.data(), piece);
    if (r <= 0) break;
    shim::check_cuda(a.cuMemcpyHtoD(reinterpret_cast<shim::CUdeviceptr>(d.data()) + off, buf.data(), static_cast<std::size_t>(r)),
                     "cuMemcpyHtoD");
    off += static_cast<std::uint64_t>(r);
  }
  ::close(fd);
}

void naive_write(const std::filesystem::path& path, const device_buffer& d, std::uint64_t size) {
  const std::size_t piece = std::size_t{64} << 20;
  std::vector<char> buf(piece);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const shim::cuda_api& a = *shim::cuda();
  gpu::context_guard ctx(d.device());
  for (std::uint64_t off = 0; off < size; off += piece) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(piece, size - off));
    shim::check_cuda(a.cuMemcpyDtoH(buf.data(), reinterpret_cast<shim::CUdeviceptr>(d.data()) + off, n), "cuMemcpyDtoH");
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) throw std::runtime_error("naive write failed");
  }
  ::fdatasync(fd);
  ::close(fd);
}

void spot_check(const std::filesystem::path& path, const device_buffer& d, std::uint64_t size, const char* what) {
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size, 16u << 20));
  std::vector<char> file(n), dev(n);
  for (std::uint64_t off : {std::uint64_t{0}, size - n, size / 2 / 4096 * 4096}) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (::pread(fd, file.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) std::exit(3);
    ::close(fd);
    d.copy_to_host(dev.data(), n, static_cast<std::size_t>(off));
    if (std::memcmp(file.data(), dev.data(), n) != 0) {
      std::printf("MISMATCH after %s at offset range %llu+%zu\n", what, static_cast<unsigned long long>(off), n);
      std::exit(3);
    }
  }
}

settings with_mode(path_mode m) {
  settings s = default_settings();
  s.mode = m;
  return s;
}

double find(const std::string& name) {
  for (auto& r : rows) {
    if (r.name == name) return r.gib_s;
  }
  return 0;
}

void verdict(const char* what, double value, double target, const char* unit = "x") {
  std::printf("  %-58s %8.3f%s  target %s %.3f%s  %s\n", what, value, unit, std::strcmp(unit, " CPU-s/GiB") == 0 ? "<=" : ">=",
              target, unit, (std::strcmp(unit, " CPU-s/GiB") == 0 ? value <= target : value >= target) ? "MET" : "MISSED");
}

}  // namespace

// Parameter sweep of the staged path (slot size, workers, O_DIRECT depth) to choose defaults by measurement.
int tune(const std::filesystem::path& path, std::uint64_t size, device_buffer& d) {
  std::printf("tune: staged path parameters, %s file\n", format_size(size).c_str());
  auto one = [&](const char* what, settings s, bool cold, bool write) {
    std::filesystem::path target = write ? std::filesystem::path(path.string() + ".tw") : path;
    gdskit::file_handle f(target, write ? open_mode::read_write : open_mode::read,
                          {.create = write, .truncate = write}, s);
    if (write) {
      f.write(d.view(), 64u << 20, 0);  // warm-up: pinned staging set for this shape
    } else {
      f.read(d.view(), 64u << 20, 0);
    }
    if (!write) cold ? drop_cache(path) : warm_cache(path);
    double c0 = cpu_s(), t0 = now_s();
    if (write) {
      f.write(d.view(), size, 0);
      f.sync();
    } else {
      f.read(d.view(), size, 0);
    }
    double dt = now_s() - t0;
    std::printf("  %-6s %-5s %-34s %8.2f GiB/s  %6.3f CPU-s/GiB\n", write ? "write" : "read", cold ? "cold" : "warm", what,
                gib(size) / dt, (cpu_s() - c0) / gib(size));
    std::fflush(stdout);
  };
  settings base = default_settings();
  base.mode = path_mode::staged;
  // Warm reads: slot size, slots per worker and workers. Two passes, so noise shows as spread, not as a trend.
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t slot : {std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{4} << 20, std::size_t{8} << 20}) {
      for (unsigned slots : {2u, 4u}) {
        for (unsigned threads : {8u, 16u}) {
          settings s = base;
          s.cached_slot_bytes = slot;  // warm reads stage through the cached-slot size
          s.staging_slots = slots;
          s.threads = threads;
          one(fmt::format("slot {} x{} threads {}", format_size(slot), slots, threads).c_str(), s, false, false);
        }
      }
    }
  }
  // Cold reads and writes at the default shape and at 2 MiB slots (the disk's noise dominates: see performance.md).
  for (std::size_t slot : {std::size_t{2} << 20, std::size_t{8} << 20}) {
    settings s = base;
    s.staging_slot_bytes = slot;
    one(fmt::format("slot {} x{} threads {}", format_size(slot), s.staging_slots, s.threads).c_str(), s, true, false);
    one(fmt::format("slot {} x{} threads {}", format_size(slot), s.staging_slots, s.threads).c_str(), s, false, true);
  }
  std::filesystem::remove(path.string() + ".tw");
  return 0;
}

// CPU seconds (user + sys) per thread name, from /proc/self/task: which threads a transfer keeps busy.
std::map<std::string, double> cpu_by_thread() {
  std::map<std::string, double> out;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "stat");
    std::string line;
    std::getline(in, line);
    const auto open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::string name = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double user = 0, sys = 0;
    for (int i = 3; rest >> field; ++i) {  // fields 14 and 15: utime, stime
      if (i == 14) user = std::stod(field);
      if (i == 15) {
        sys = std::stod(field);
        break;
      }
    }
    // Exited threads drop out of /proc/self/task; the pools used here are long-lived.
    out[name] += (user + sys) / tick;
  }
  return out;
}

// Prints the CPU time each thread name used since `before`, per GiB moved.
void print_cpu_by_thread(const std::map<std::string, double>& before, std::uint64_t size, const char* indent) {
  for (const auto& [name, sec] : cpu_by_thread()) {
    const auto it = before.find(name);
    const double delta = sec - (it != before.end() ? it->second : 0.0);
    if (delta > 0) std::printf("%s%-20s %.3f CPU-s/GiB\n", indent, name.c_str(), delta / gib(size));
  }
}

// Where the CPU time of a cold staged read goes, by thread name.
int cpu_profile(const std::filesystem::path& path, std::uint64_t size, device_buffer& d) {
  gdskit::file_handle f(path, open_mode::read, {}, with_mode(path_mode::staged));
  drop_cache(path);
  f.read(d.view(), std::min<std::uint64_t>(size, 1u << 30), 0);  // lanes, streams
  drop_cache(path);
  auto before = cpu_by_thread();
  double c0 = cpu_s(), t0 = now_s();
  f.read(d.view(), size, 0);
  double dt = now_s() - t0, cpu = cpu_s() - c0;
  std::printf("cold staged read, %s: %.2f GiB/s, %.3f CPU-s/GiB (getrusage); %s\n", format_size(size).c_str(),
              gib(size) / dt, cpu / gib(size), f.plan(d.view()).summary().c_str());
  print_cpu_by_thread(before, size, "  ");
  return 0;
}

constexpr const char* k_usage =
    "usage: gpu_compare_bench [FILE] [SIZE] [MAX_THREADS] [tune|cpu]\n"
    "  FILE (default gdskit-gpu-bench.dat, 8G, rounded down to 64 MiB) <-> GPU memory through gdskit's paths,\n"
    "  cold and warm, against raw parallel reads and writes with 1 .. MAX_THREADS threads (default 16), pinned\n"
    "  copies and read() + copy, in one run. It writes FILE.w and FILE.tw and removes them. FILE is made with\n"
    "  random data when absent; an existing FILE is used only when it has exactly SIZE bytes. tune: a sweep of\n"
    "  the staged path's slot size, workers and O_DIRECT depth; cpu: where a cold staged read's CPU time goes.\n";

int main(int argc, char** argv) {
  const args_verdict v = check_args(argc, argv, k_usage);
  if (v != args_verdict::run) return v == args_verdict::help ? 0 : 2;
  std::filesystem::path path = argc > 1 ? argv[1] : "gdskit-gpu-bench.dat";
  std::uint64_t size = argc > 2 ? parse_size(argv[2]).value_or(0) : (std::uint64_t{8} << 30);
  const auto threads_arg = argc > 3 ? parse_count(argv[3], 1, 1024) : std::optional<unsigned long>(16);
  const std::string_view mode = argc > 4 ? std::string_view(argv[4]) : std::string_view();
  if (size < (64u << 20) || !threads_arg || argc > 5 || !(mode.empty() || mode == "tune" || mode == "cpu")) {
    std::fputs(k_usage, stderr);
    return 2;
  }
  unsigned max_threads = static_cast<unsigned>(*threads_arg);
  std::string reason;
  if (!gpu_available(&reason)) {
    std::printf("gpu_compare_bench: no usable GPU (%s)\n", reason.c_str());
    return 77;
  }
  size = size / (64u << 20) * (64u << 20);
  std::filesystem::path wpath = path.string() + ".w";
  try {
    ensure_file(path, size);
    check_scratch(wpath, size);
    check_scratch(path.string() + ".tw", size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_compare_bench: %s\n", e.what());
    return 2;
  }
  device_buffer d(size, 0);
  if (argc > 4 && std::string_view(argv[4]) == "tune") return tune(path, size, d);
  if (argc > 4 && std::string_view(argv[4]) == "cpu") return cpu_profile(path, size, d);
  std::printf("file %s, %s; GPU 0; gdskit threads %u, O_DIRECT depth %u, staging %u x %s per worker (%s from the page cache)\n",
              path.c_str(), format_size(size).c_str(), default_settings().threads, default_settings().direct_depth,
              default_settings().staging_slots, format_size(default_settings().staging_slot_bytes).c_str(),
              format_size(default_settings().cached_slot_bytes).c_str());
  {
    const pinned_buffer probe(default_settings().staging_slot_bytes * default_settings().staging_slots, 0);
    const std::string mode = posix::transparent_hugepage_mode();
    std::printf("pinned memory: %s of a %s lane on 2 MiB pages (transparent_hugepage: %s)\n",
                format_size(probe.huge_page_bytes()).c_str(), format_size(probe.size()).c_str(),
                mode.empty() ? "unknown" : mode.c_str());
  }

  std::printf("\nceilings\n");
  rows.push_back({"pinned host->device copy", copy_ceiling(d, true), 0, ""});
  std::printf("  %-40s %8.2f GiB/s\n", "pinned host->device copy", rows.back().gib_s);
  rows.push_back({"pinned device->host copy", copy_ceiling(d, false), 0, ""});
  std::printf("  %-40s %8.2f GiB/s\n", "pinned device->host copy", rows.back().gib_s);
  rate buffered = best_parallel_read(path, max_threads, false, false);
  rows.push_back({"parallel buffered read, warm", buffered.gib_s, buffered.cpu_s_per_gib, fmt::format("{} threads", buffered.threads)});
  std::printf("  %-40s %8.2f GiB/s  (%u threads)\n", "parallel buffered read, warm", buffered.gib_s, buffered.threads);
  rate direct = best_parallel_read(path, max_threads, true, true);
  rows.push_back({"parallel O_DIRECT read", direct.gib_s, direct.cpu_s_per_gib, fmt::format("{} threads", direct.threads)});
  std::printf("  %-40s %8.2f GiB/s  (%u threads)\n", "parallel O_DIRECT read", direct.gib_s, direct.threads);
  rate dwrite = best_parallel_write_direct(wpath, size, max_threads);
  rows.push_back({"parallel O_DIRECT write", dwrite.gib_s, dwrite.cpu_s_per_gib, fmt::format("{} threads", dwrite.threads)});
  std::printf("  %-40s %8.2f GiB/s  (%u threads)\n", "parallel O_DIRECT write", dwrite.gib_s, dwrite.threads);

  for (bool cold : {true, false}) {
    const char* tag = cold ? "cold" : "warm";
    std::printf("\nread, %s\n", tag);
    auto prep = [&] { cold ? drop_cache(path) : warm_cache(path); };
    prep();
    timed(fmt::format("naive read()+cuMemcpy, {}", tag), size, [&] { naive_read(path, d, size); });
    // gdskit's staged read before cuFile is ever opened in this process: once open, cuFile keeps threads of
    // its own whose CPU time getrusage would charge to every later measurement.
    {
      gdskit::file_handle f(path, open_mode::read, {}, with_mode(path_mode::staged));
      // Warm-up in the same state as the measurement, large enough to take every lane: the pinned lanes
      // (cuMemHostAlloc) are set up once per process, and a loader pays that once, not per read.
      prep();
      f.read(d.view(), std::min<std::uint64_t>(size, 1u << 30), 0);
      d.fill(0);
      prep();
      auto threads_before = cpu_by_thread();
      timed(fmt::format("gdskit staged, {}", tag), size, [&] { f.read(d.view(), size, 0); }, f.plan(d.view()).summary());
      std::printf("    CPU by thread:\n");
      print_cpu_by_thread(threads_before, size, "      ");
      spot_check(path, d, size, "staged read");
    }
    {
      gdskit::file_handle f(path, open_mode::read, {}, with_mode(path_mode::compat));
      prep();
      try {
        timed(fmt::format("cuFile (compat), {}", tag), size, [&] { f.read(d.view(), size, 0); }, f.plan(d.view()).summary());
        spot_check(path, d, size, "cuFile read");
      } catch (const error& e) {
        failed(fmt::format("cuFile (compat), {}", tag), e.what());
      }
    }
  }

  std::printf("\nwrite (device -> file, fdatasync included)\n");
  timed("naive cuMemcpy+write()", size, [&] { naive_write(wpath, d, size); });
  {
    gdskit::file_handle f(wpath, open_mode::read_write, {.create = true, .truncate = true}, with_mode(path_mode::compat));
    try {
      timed("cuFile (compat) write", size, [&] { f.write(d.view(), size, 0); f.sync(); });
    } catch (const error& e) {
      failed("cuFile (compat) write", e.what());
    }
  }
  {
    gdskit::file_handle f(wpath, open_mode::read_write, {.create = true, .truncate = true}, with_mode(path_mode::staged));
    f.write(d.view(), 64u << 20, 0);  // lanes for writes share the cold read's pinned lanes (same slot size)
    f.truncate(0);
    timed("gdskit staged write", size, [&] { f.write(d.view(), size, 0); f.sync(); }, f.plan(d.view()).summary());
    drop_cache(wpath);
    spot_check(wpath, d, size, "staged write");
  }

  std::printf("\nverdicts\n");
  const double warm = find("gdskit staged, warm"), cold = find("gdskit staged, cold");
  const double ceiling_warm = std::min(find("parallel buffered read, warm"), find("pinned host->device copy"));
  verdict("warm staged / min(buffered read, host->device copy)", warm / ceiling_warm, 0.90);
  verdict("warm staged / naive read+copy (warm)", warm / find("naive read()+cuMemcpy, warm"), 15);
  if (find("cuFile (compat), warm") > 0) verdict("warm staged / cuFile compat (warm)", warm / find("cuFile (compat), warm"), 10);
  verdict("cold staged / parallel O_DIRECT read", cold / find("parallel O_DIRECT read"), 0.95);
  verdict("staged write / parallel O_DIRECT write", find("gdskit staged write") / find("parallel O_DIRECT write"), 0.90);
  for (auto& r : rows) {
    if (r.name == "gdskit staged, cold") verdict("CPU time of the cold staged read", r.cpu_per_gib, 0.05, " CPU-s/GiB");
  }
  std::filesystem::remove(wpath);
  return 0;
}
