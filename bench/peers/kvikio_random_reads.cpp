// Peer benchmark: many small random reads from a file into GPU memory through KvikIO (rapidsai/kvikio, C++ API),
// issued the way a KvikIO user would issue them, so that gdskit's batch reader can be compared with what KvikIO
// gives on the same file, read size and queue depth.
//
//   kvikio_random_reads FILE IO_BYTES DEPTH SECONDS
//
// KvikIO has no batch read API on its POSIX path (its BatchHandle only wraps cuFile's batch API, which needs
// cuFile and nvidia-fs). What a user does instead is keep many FileHandle::pread() futures in flight and let
// KvikIO's thread pool run them. This program does exactly that: DEPTH reads of IO_BYTES each, at uniformly random
// IO_BYTES-aligned offsets, each into its own slot of one device allocation; whenever the oldest read completes,
// its slot is reused for the next offset, until SECONDS have passed.
//
// KvikIO settings, chosen to be its best for this workload (all set before the file is opened):
//   thread pool of DEPTH threads  KvikIO's default is 1 thread, which would serialise every read; with DEPTH
//                                 threads each in-flight read has a thread to block in pread().
//   task_size >= IO_BYTES         pread() splits a request into task_size pieces; one task per read avoids the
//                                 extra tasks and the joining task a split read needs.
//   gds_threshold 0               reads below the threshold (16 KiB by default) skip the pool and run synchronously
//                                 in the calling thread, i.e. at depth 1 whatever DEPTH is.
//   auto_direct_io_read on        the bounce-buffer reads use O_DIRECT when offset and size are page aligned (they
//                                 are here), so reads are cold, as gdskit's are, rather than page-cache hits.
//   CompatMode::ON                KvikIO's POSIX path (pread into a pinned host bounce buffer, then a copy to the
//                                 GPU); the GPU machine has no nvidia-fs, so cuFile would only be its own POSIX
//                                 fallback anyway.
// Other KVIKIO_* environment variables (e.g. KVIKIO_BOUNCE_BUFFER_SIZE) still apply; the effective settings are
// printed on stderr.
//
// Not measured: CUDA and KvikIO set-up, and one untimed round of DEPTH reads before the measured loop, which lets
// KvikIO allocate and register its pinned bounce buffers and create its per-thread streams; a user who issues many
// reads pays those once, not per read.
//
// Output on stdout: one JSON line
//   {"what": "kvikio", "io": N, "depth": N, "nbytes": N, "ops": N, "seconds": X, "cpu_seconds": X,
//    "nthreads": N, "task_size": N}
// then one line per completed read with its latency in seconds. seconds is wall time and cpu_seconds the process's
// user+system CPU time, both over the measured loop only (including the final drain of the reads in flight).
// Exit status: 0 success, 1 a failure while reading, 2 bad arguments or no usable CUDA driver/device.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <kvikio/compat_mode.hpp>
#include <kvikio/defaults.hpp>
#include <kvikio/file_handle.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

constexpr const char* kName = "kvikio_random_reads";
constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kMaxIo = 64ull << 20;
constexpr unsigned kMaxDepth = 256;
constexpr double kMaxSeconds = 600;
constexpr std::size_t kOffsetTableSize = std::size_t{1} << 20;
constexpr std::uint64_t kSeed = 21;

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: %s FILE IO_BYTES DEPTH SECONDS\n"
               "  Random reads of IO_BYTES each from FILE into GPU memory (device 0) through KvikIO's\n"
               "  FileHandle::pread, DEPTH reads in flight, for SECONDS.\n"
               "  FILE      an existing regular file of at least IO_BYTES bytes\n"
               "  IO_BYTES  a positive multiple of 4096, at most 67108864 (64 MiB)\n"
               "  DEPTH     reads in flight, 1..256 (also the size of KvikIO's thread pool)\n"
               "  SECONDS   measured duration, > 0 and <= 600 (decimals allowed)\n"
               "  stdout: a JSON summary line, then one latency (seconds) per completed read.\n"
               "  exit: 0 ok, 1 read failure, 2 bad arguments or no usable CUDA driver/device.\n",
               kName);
}

// Arguments and library messages may carry bytes that would drive a terminal; show them defanged and bounded.
std::string printable(std::string_view s) {
  constexpr std::size_t kMax = 256;
  std::string out;
  for (char c : s.substr(0, kMax)) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7f ? c : '?');
  }
  if (s.size() > kMax) out += "...";
  return out;
}

[[noreturn]] void bad_input(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  usage(stderr);
  std::exit(2);
}

// Flushes what was said and leaves without running static destructors: reads may still be in flight on KvikIO's
// pool, and its destructor would wait for them (or they would write into freed memory).
[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

// Plain decimal digits only: no sign, no spaces, no hex, no suffix, so a typo cannot silently mean something else.
bool parse_u64(const char* s, std::uint64_t& out) {
  if (*s == '\0') return false;
  std::uint64_t v = 0;
  for (; *s != '\0'; ++s) {
    if (*s < '0' || *s > '9') return false;
    const std::uint64_t d = static_cast<std::uint64_t>(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

// DIGITS[.DIGITS] or .DIGITS, nothing else (no exponent, inf or nan).
bool parse_seconds(const char* s, double& out) {
  std::size_t digits = 0, dots = 0;
  for (const char* p = s; *p != '\0'; ++p) {
    if (*p >= '0' && *p <= '9') {
      ++digits;
    } else if (*p == '.') {
      ++dots;
    } else {
      return false;
    }
  }
  if (digits == 0 || dots > 1 || std::strlen(s) > 32) return false;
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end != nullptr && *end == '\0' && std::isfinite(out);
}

struct arguments {
  std::string path;
  std::uint64_t io = 0;
  unsigned depth = 0;
  double seconds = 0;
  std::uint64_t file_size = 0;
};

arguments parse_arguments(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      std::exit(0);
    }
  }
  if (argc != 5) bad_input("expected 4 arguments, got " + std::to_string(argc - 1));

  arguments a;
  a.path = argv[1];
  if (a.path.empty()) bad_input("FILE is empty");

  std::uint64_t v = 0;
  if (!parse_u64(argv[2], v) || v == 0 || v % kAlign != 0 || v > kMaxIo) {
    bad_input("IO_BYTES '" + printable(argv[2]) + "' is not a positive multiple of 4096 up to 67108864");
  }
  a.io = v;
  if (!parse_u64(argv[3], v) || v < 1 || v > kMaxDepth) {
    bad_input("DEPTH '" + printable(argv[3]) + "' is not an integer in 1..256");
  }
  a.depth = static_cast<unsigned>(v);
  if (!parse_seconds(argv[4], a.seconds) || !(a.seconds > 0) || a.seconds > kMaxSeconds) {
    bad_input("SECONDS '" + printable(argv[4]) + "' is not a number > 0 and <= 600");
  }

  // Opened rather than only stat()ed, so that an unreadable file is reported here as bad input; without blocking,
  // so that a FIFO named by mistake is refused below instead of waiting for a writer.
  const int fd = ::open(a.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) bad_input("cannot open FILE '" + printable(a.path) + "': " + std::strerror(errno));
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) bad_input("cannot stat FILE '" + printable(a.path) + "': " + std::strerror(saved));
  if (!S_ISREG(st.st_mode)) bad_input("FILE '" + printable(a.path) + "' is not a regular file");
  a.file_size = static_cast<std::uint64_t>(st.st_size);
  if (a.file_size < a.io) {
    bad_input("FILE '" + printable(a.path) + "' holds " + std::to_string(a.file_size) + " bytes, less than IO_BYTES (" +
              std::to_string(a.io) + ")");
  }
  return a;
}

// The few driver entry points needed, taken from libcuda.so.1 at run time: the program links no CUDA library, so
// it starts (and says why it cannot run) on a machine without a driver. KvikIO loads the same library itself.
struct cuda_driver {
  CUresult (*init)(unsigned int) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;  // optional, for messages only

  std::string describe(CUresult r) const {
    const char* name = nullptr;
    if (get_error_name != nullptr && get_error_name(r, &name) == CUDA_SUCCESS && name != nullptr) {
      return printable(name) + " (" + std::to_string(static_cast<int>(r)) + ")";
    }
    return "CUresult " + std::to_string(static_cast<int>(r));
  }
};

template <typename F>
bool bind(void* lib, const char* symbol, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(lib, symbol));
  return fn != nullptr;
}

cuda_driver load_cuda_driver() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    fail(2, "cannot load libcuda.so.1 (no CUDA driver on this machine?): " + printable(why != nullptr ? why : "?"));
  }
  cuda_driver d;
  const char* missing = nullptr;
  if (!bind(lib, "cuInit", d.init)) missing = "cuInit";
  if (!bind(lib, "cuDeviceGet", d.device_get)) missing = "cuDeviceGet";
  if (!bind(lib, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain)) missing = "cuDevicePrimaryCtxRetain";
  if (!bind(lib, "cuCtxSetCurrent", d.ctx_set_current)) missing = "cuCtxSetCurrent";
  if (!bind(lib, "cuMemAlloc_v2", d.mem_alloc)) missing = "cuMemAlloc_v2";
  if (!bind(lib, "cuMemFree_v2", d.mem_free)) missing = "cuMemFree_v2";
  // cuda.h maps cuDevicePrimaryCtxRelease to its _v2 entry point; older drivers export only the plain one.
  if (!bind(lib, "cuDevicePrimaryCtxRelease_v2", d.primary_ctx_release) &&
      !bind(lib, "cuDevicePrimaryCtxRelease", d.primary_ctx_release)) {
    missing = "cuDevicePrimaryCtxRelease";
  }
  bind(lib, "cuGetErrorName", d.get_error_name);
  if (missing != nullptr) fail(2, std::string("libcuda.so.1 lacks ") + missing + " (driver too old?)");
  return d;
}

// Offsets at random slots of IO_BYTES plus at least 20 KiB (a multiple of IO_BYTES), the spacing
// bench/batch_bench.cpp gives every row's ranges so that its batches can join none of them: the same kind of
// reads at the same spread over the file. rng() % slots rather than std::uniform_int_distribution, whose output is
// implementation-defined; the modulo bias is below slots / 2^64, i.e. nil.
std::vector<std::uint64_t> random_offsets(std::uint64_t file_size, std::uint64_t io) {
  // 20 KiB: gdskit's default coalescing gap (batch_options::coalesce_gap_bytes, 16 KiB) and a page more.
  const std::uint64_t stride = io + ((20 << 10) + io - 1) / io * io;
  std::mt19937_64 rng(kSeed);
  const std::uint64_t slots = std::max<std::uint64_t>(1, file_size / stride);
  std::vector<std::uint64_t> out(kOffsetTableSize);
  for (auto& o : out) o = (rng() % slots) * stride;
  return out;
}

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

struct slot {
  std::future<std::size_t> pending;
  std::uint64_t offset = 0;
  clock_type::time_point submitted;
};

}  // namespace

int main(int argc, char** argv) {
  // Up to about a million latency lines go out at the end; a large buffer keeps that to a few big writes.
  static char stdout_buffer[1 << 22];
  std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);

  const arguments args = parse_arguments(argc, argv);

  // CUDA: device 0's primary context, current on this thread, so that KvikIO finds the context that owns the
  // destination memory (it queries the pointer and pushes that context in its pool threads).
  const cuda_driver cu = load_cuda_driver();
  if (CUresult r = cu.init(0); r != CUDA_SUCCESS) fail(2, "cuInit failed: " + cu.describe(r) + " (no usable GPU?)");
  CUdevice dev{};
  if (CUresult r = cu.device_get(&dev, 0); r != CUDA_SUCCESS) fail(2, "cuDeviceGet(0) failed: " + cu.describe(r));
  CUcontext ctx{};
  if (CUresult r = cu.primary_ctx_retain(&ctx, dev); r != CUDA_SUCCESS) {
    fail(2, "cuDevicePrimaryCtxRetain failed: " + cu.describe(r));
  }
  if (CUresult r = cu.ctx_set_current(ctx); r != CUDA_SUCCESS) fail(2, "cuCtxSetCurrent failed: " + cu.describe(r));
  const std::uint64_t depth = args.depth;
  CUdeviceptr device_base{};
  if (CUresult r = cu.mem_alloc(&device_base, depth * args.io); r != CUDA_SUCCESS) {
    fail(1, "cuMemAlloc of " + std::to_string(depth * args.io) + " bytes failed: " + cu.describe(r));
  }
  const auto slot_pointer = [&](std::uint64_t i) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(device_base + i * args.io));
  };

  const std::vector<std::uint64_t> offsets = random_offsets(args.file_size, args.io);
  std::size_t next_offset = 0;
  const auto take_offset = [&] {
    const std::uint64_t o = offsets[next_offset];
    next_offset = (next_offset + 1) % offsets.size();
    return o;
  };

  std::vector<slot> slots(depth);
  std::vector<std::uint64_t> latency_ns;
  // Enough for most runs without growing; growing later only costs an occasional copy.
  latency_ns.reserve(std::size_t{1} << 22);
  std::uint64_t ops = 0;
  double wall = 0, cpu = 0;
  unsigned nthreads = 0;
  std::size_t task_size = 0;

  try {
    kvikio::defaults::set_thread_pool_nthreads(args.depth);
    kvikio::defaults::set_task_size(std::max<std::size_t>(args.io, kvikio::defaults::task_size()));
    kvikio::defaults::set_gds_threshold(0);
    kvikio::defaults::set_auto_direct_io_read(true);
    nthreads = kvikio::defaults::thread_pool_nthreads();
    task_size = kvikio::defaults::task_size();

    kvikio::FileHandle fh(args.path, "r", 0644, kvikio::CompatMode::ON);
    std::fprintf(stderr,
                 "%s: file_size=%llu io=%llu depth=%u seconds=%g | kvikio nthreads=%u task_size=%zu gds_threshold=%zu "
                 "bounce_buffer_size=%zu auto_direct_io_read=%d o_direct_fd=%s compat_mode=ON\n",
                 kName, static_cast<unsigned long long>(args.file_size), static_cast<unsigned long long>(args.io),
                 args.depth, args.seconds, nthreads, task_size, kvikio::defaults::gds_threshold(),
                 kvikio::defaults::bounce_buffer_size(), kvikio::defaults::auto_direct_io_read() ? 1 : 0,
                 fh.fd(true) >= 0 ? "open" : "unavailable (buffered reads: page cache)");

    const auto submit = [&](std::uint64_t i) {
      slot& s = slots[i];
      s.offset = take_offset();
      s.submitted = clock_type::now();
      s.pending = fh.pread(slot_pointer(i), args.io, s.offset);
    };
    // Returns when slot i's read has completed, or leaves with status 1 if it failed or came back short.
    const auto complete = [&](std::uint64_t i) {
      slot& s = slots[i];
      std::size_t got = 0;
      try {
        got = s.pending.get();
      } catch (const std::exception& e) {
        fail(1, "read of " + std::to_string(args.io) + " bytes at offset " + std::to_string(s.offset) +
                    " failed: " + printable(e.what()));
      } catch (...) {
        fail(1, "read at offset " + std::to_string(s.offset) + " failed with an unknown exception");
      }
      const auto done = clock_type::now();
      if (got != args.io) {
        fail(1, "read at offset " + std::to_string(s.offset) + " returned " + std::to_string(got) + " bytes, not " +
                    std::to_string(args.io));
      }
      return done;
    };

    // Untimed round: KvikIO allocates and registers a pinned bounce buffer per concurrent task and a stream per
    // pool thread on first use, a one-off cost that is not what the steady state of many reads looks like.
    for (std::uint64_t i = 0; i < depth; ++i) submit(i);
    for (std::uint64_t i = 0; i < depth; ++i) complete(i);

    const double cpu0 = cpu_seconds();
    const auto start = clock_type::now();
    const auto deadline =
        start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(args.seconds));
    for (std::uint64_t i = 0; i < depth; ++i) submit(i);

    // Slots are resubmitted in the order they complete here, so the oldest read is always at `head`.
    // Waiting in submission order makes each latency an upper bound: a read that finished while an older one was
    // still pending is only seen (and timed) once the older one has been collected.
    std::uint64_t head = 0;
    for (;;) {
      const auto done = complete(head);
      latency_ns.push_back(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(done - slots[head].submitted).count()));
      ++ops;
      if (done >= deadline) break;
      submit(head);
      head = (head + 1) % depth;
    }
    // Drain: the other depth - 1 slots still hold reads, oldest first after `head`.
    for (std::uint64_t k = 1; k < depth; ++k) {
      const std::uint64_t i = (head + k) % depth;
      const auto done = complete(i);
      latency_ns.push_back(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(done - slots[i].submitted).count()));
      ++ops;
    }
    wall = std::chrono::duration<double>(clock_type::now() - start).count();
    cpu = cpu_seconds() - cpu0;
  } catch (const std::exception& e) {
    fail(1, "KvikIO: " + printable(e.what()));
  }

  if (CUresult r = cu.mem_free(device_base); r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: cuMemFree failed: %s\n", kName, cu.describe(r).c_str());
  }
  cu.primary_ctx_release(dev);

  const std::uint64_t nbytes = ops * args.io;
  std::fprintf(stderr, "%s: %llu reads in %.3f s: %.0f IOPS, %.1f MiB/s, %.2f CPU-s per s\n", kName,
               static_cast<unsigned long long>(ops), wall, static_cast<double>(ops) / wall,
               static_cast<double>(nbytes) / wall / (1 << 20), cpu / wall);

  std::printf(
      "{\"what\": \"kvikio\", \"io\": %llu, \"depth\": %u, \"nbytes\": %llu, \"ops\": %llu, \"seconds\": %.9g, "
      "\"cpu_seconds\": %.9g, \"nthreads\": %u, \"task_size\": %zu}\n",
      static_cast<unsigned long long>(args.io), args.depth, static_cast<unsigned long long>(nbytes),
      static_cast<unsigned long long>(ops), wall, cpu, nthreads, task_size);
  for (const std::uint64_t ns : latency_ns) std::printf("%.9g\n", static_cast<double>(ns) * 1e-9);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "%s: writing the results to stdout failed: %s\n", kName, std::strerror(errno));
    return 1;
  }
  return 0;
}
