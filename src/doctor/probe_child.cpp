// The probe process: one cuFile configuration per process (cuFile reads its configuration once), driven
// step by step. Every call is checked and every failure becomes a reported step, never an exception.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/json_text.hpp"
#include "doctor/json_input.hpp"
#include "doctor/probe.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/cufile.hpp"

namespace gdskit::doctor {
namespace {

using json = nlohmann::json;

probe_step ok_step() { return {true, 0, "ok"}; }
probe_step fail_step(int code, std::string message) { return {true, code, std::move(message)}; }

// A code as the probe reports it: cuFile statuses as themselves, errno values negated.
int code_of(const std::error_code& ec) {
  if (ec.category() == cufile_category()) return ec.value();
  if (ec.category() == std::generic_category() || ec.category() == std::system_category()) return -ec.value();
  return ec.value();
}

std::string cufile_message(int status) {
  switch (status) {
    case 5001: return "CU_FILE_DRIVER_NOT_INITIALIZED: " + cufile_code(status).message();
    case 5008: return "CU_FILE_IO_NOT_SUPPORTED: " + cufile_code(status).message();
    case 5027: return "CU_FILE_HANDLE_NOT_REGISTERED: " + cufile_code(status).message();
    case 5036: return "CU_FILE_PINNING_ERROR: " + cufile_code(status).message();
    case 5049: return "CU_FILE_BATCH_NOCOMPAT_ERROR: " + cufile_code(status).message();
    default: return cufile_code(status).message();
  }
}

std::byte pattern_at(std::uint64_t i, std::uint64_t salt) {
  std::uint64_t x = (i / 8 + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return static_cast<std::byte>((x >> ((i % 8) * 8)) & 0xff);
}

// cuFileRead/cuFileWrite result -> step.
probe_step io_step(const char* what, long long got, int err, std::size_t want) {
  if (got == static_cast<long long>(want)) return ok_step();
  if (got >= 0) return fail_step(-EIO, fmt::format("{}: short transfer, {} of {} bytes", what, got, want));
  std::error_code ec = decode_cufile_ssize(got, err);
  return fail_step(code_of(ec), fmt::format("{}: {}", what, ec.category() == cufile_category() ? cufile_message(ec.value()) : ec.message()));
}

io_path_counts counts_delta(const shim::cufile_path_counters& a, const shim::cufile_path_counters& b) {
  auto d = [](std::uint64_t x, std::uint64_t y) { return y >= x ? y - x : 0; };
  io_path_counts c;
  c.reads = d(a.reads, b.reads);
  c.p2p_reads = d(a.p2p_reads, b.p2p_reads);
  c.nvfs_reads = d(a.nvfs_reads, b.nvfs_reads);
  c.posix_reads = d(a.posix_reads, b.posix_reads);
  c.writes = d(a.writes, b.writes);
  c.p2p_writes = d(a.p2p_writes, b.p2p_writes);
  c.nvfs_writes = d(a.nvfs_writes, b.nvfs_writes);
  c.posix_writes = d(a.posix_writes, b.posix_writes);
  return c;
}

json step_to_json(const probe_step& s) { return {{"attempted", s.attempted}, {"code", s.code}, {"message", s.message}}; }

probe_step step_from_json(const json& j) {
  probe_step s;
  if (!j.is_object()) return s;
  s.attempted = j.value("attempted", false);
  s.code = j.value("code", 0);
  s.message = j.value("message", std::string());
  return s;
}

void sweep(child_report& c, shim::CUfileHandle_t fh, void* dev, std::uint64_t bytes, const std::vector<int>& qds) {
  const shim::cufile_api* a = shim::cufile();
  int max_qd = 1;
  for (int q : qds) max_qd = std::max(max_qd, q);
  std::uint64_t io = 1u << 20;
  while (io > 4096 && io * static_cast<std::uint64_t>(max_qd) > bytes) io /= 2;
  const std::uint64_t chunks = bytes / io;
  if (chunks == 0 || a == nullptr) return;
  using clk = std::chrono::steady_clock;
  for (int qd : qds) {
    if (qd < 1) continue;
    std::atomic<std::uint64_t> next{0}, moved{0};
    std::atomic<bool> failed{false};
    std::string failure;
    std::mutex mu;
    const auto t0 = clk::now();
    const auto limit = t0 + std::chrono::milliseconds(500);
    const std::uint64_t cap = std::max<std::uint64_t>(bytes * 4, 256ull << 20);
    std::vector<std::thread> ts;
    for (int t = 0; t < qd; ++t) {
      ts.emplace_back([&, t] {
        try {
          shim::use_device(0);
        } catch (const std::exception& e) {
          std::lock_guard lk(mu);
          failed = true;
          failure = e.what();
          return;
        }
        while (!failed.load() && moved.load() < cap && clk::now() < limit) {
          const std::uint64_t k = next.fetch_add(1) % chunks;
          errno = 0;
          ssize_t got = a->cuFileRead(fh, dev, io, static_cast<off_t>(k * io), static_cast<off_t>(t * io));
          if (got != static_cast<ssize_t>(io)) {
            probe_step s = io_step("cuFileRead", got, errno, io);
            std::lock_guard lk(mu);
            failed = true;
            failure = s.message;
            return;
          }
          moved.fetch_add(io);
        }
      });
    }
    for (auto& th : ts) th.join();
    const double secs = std::chrono::duration<double>(clk::now() - t0).count();
    if (failed) {
      c.notes.push_back(fmt::format("sweep stopped at queue depth {}: {}", qd, failure));
      return;
    }
    c.sweep.push_back({qd, io, secs > 0 ? static_cast<double>(moved.load()) / secs / double(1u << 30) : 0.0});
  }
}

}  // namespace

std::string child_report_line(const child_report& c) {
  json stats = nullptr;
  if (c.stats) {
    const auto& d = *c.stats;
    stats = {{"reads", d.reads},   {"p2p_reads", d.p2p_reads},   {"nvfs_reads", d.nvfs_reads},   {"posix_reads", d.posix_reads},
             {"writes", d.writes}, {"p2p_writes", d.p2p_writes}, {"nvfs_writes", d.nvfs_writes}, {"posix_writes", d.posix_writes}};
  }
  json sw = json::array();
  for (const auto& p : c.sweep) sw.push_back({{"queue_depth", p.queue_depth}, {"io_size_bytes", p.io_size_bytes}, {"gib_per_s", p.gib_per_s}});
  json j = {{"mode", c.mode},
            {"cuda_init", step_to_json(c.cuda_init)},
            {"driver_open", step_to_json(c.driver_open)},
            {"handle_register", step_to_json(c.handle_register)},
            {"buf_register", step_to_json(c.buf_register)},
            {"write", step_to_json(c.write)},
            {"read", step_to_json(c.read)},
            {"verified", c.verified},
            {"o_direct", c.o_direct},
            {"file_device", c.file_device},
            {"stats", stats},
            {"sweep", sw},
            {"notes", c.notes}};
  return std::string(kChildMarker) + json_text(j, -1) + "\n";
}

std::optional<child_report> parse_child_report(const std::string& text, std::string* why) {
  const std::string marker(kChildMarker);
  std::size_t at = std::string::npos;
  for (std::size_t pos = text.find(marker); pos != std::string::npos; pos = text.find(marker, pos + 1))
    if (pos == 0 || text[pos - 1] == '\n') at = pos;
  if (at == std::string::npos) {
    if (why != nullptr) *why = "no report line in the probe process's output";
    return std::nullopt;
  }
  std::size_t end = text.find('\n', at);
  std::string body = text.substr(at + marker.size(), end == std::string::npos ? std::string::npos : end - at - marker.size());
  try {
    std::string bad;
    json j = parse_json_bounded(body, /*comments=*/false, bad);
    if (!bad.empty()) throw std::runtime_error(bad);
    if (!j.is_object()) throw std::runtime_error("not an object");
    child_report c;
    c.mode = j.value("mode", std::string());
    c.cuda_init = step_from_json(j.value("cuda_init", json()));
    c.driver_open = step_from_json(j.value("driver_open", json()));
    c.handle_register = step_from_json(j.value("handle_register", json()));
    c.buf_register = step_from_json(j.value("buf_register", json()));
    c.write = step_from_json(j.value("write", json()));
    c.read = step_from_json(j.value("read", json()));
    c.verified = j.value("verified", false);
    c.o_direct = j.value("o_direct", false);
    c.file_device = j.value("file_device", std::string());
    if (j.contains("stats") && j["stats"].is_object()) {
      const json& s = j["stats"];
      io_path_counts d;
      d.reads = s.value("reads", std::uint64_t{0});
      d.p2p_reads = s.value("p2p_reads", std::uint64_t{0});
      d.nvfs_reads = s.value("nvfs_reads", std::uint64_t{0});
      d.posix_reads = s.value("posix_reads", std::uint64_t{0});
      d.writes = s.value("writes", std::uint64_t{0});
      d.p2p_writes = s.value("p2p_writes", std::uint64_t{0});
      d.nvfs_writes = s.value("nvfs_writes", std::uint64_t{0});
      d.posix_writes = s.value("posix_writes", std::uint64_t{0});
      c.stats = d;
    }
    if (j.contains("sweep") && j["sweep"].is_array())
      for (const auto& p : j["sweep"])
        if (p.is_object())
          c.sweep.push_back({p.value("queue_depth", 0), p.value("io_size_bytes", std::uint64_t{0}), p.value("gib_per_s", 0.0)});
    if (j.contains("notes") && j["notes"].is_array())
      for (const auto& n : j["notes"])
        if (n.is_string()) c.notes.push_back(n.get<std::string>());
    return c;
  } catch (const std::exception& e) {
    if (why != nullptr) *why = fmt::format("malformed report line from the probe process: {}", e.what());
    return std::nullopt;
  }
}

child_report run_probe_child(const std::string& mode, const std::filesystem::path& file, std::uint64_t bytes,
                             const std::vector<int>& queue_depths) {
  child_report c;
  c.mode = mode;
  bytes = std::max<std::uint64_t>(bytes / 4096 * 4096, 1u << 20);
  try {
    // CUDA first: libcufile needs a usable driver and a context on the GPU it will use.
    try {
      shim::use_device(0);
      c.cuda_init = ok_step();
    } catch (const gdskit::error& e) {
      c.cuda_init = fail_step(e.code().value(), e.what());
      return c;
    } catch (const std::exception& e) {
      c.cuda_init = fail_step(-1, e.what());
      return c;
    }
    std::string why;
    if (shim::cufile(&why) == nullptr) {
      c.driver_open = fail_step(shim::CU_FILE_DRIVER_NOT_INITIALIZED, "libcufile not usable: " + why);
      return c;
    }
    const shim::cufile_api* a = shim::cufile();
    const bool stats_on = shim::cufile_enable_stats();
    if (!stats_on) c.notes.push_back("cuFile statistics unavailable (cuFileSetStatsLevel/cuFileGetStatsL3 missing or refused)");
    const int open_status = shim::cufile_driver_open();
    c.driver_open = open_status == 0 ? ok_step() : fail_step(open_status, cufile_message(open_status));
    if (open_status != 0) return c;

    // The test file: O_DIRECT where the file system takes it (what cuFile wants), else buffered.
    int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
    if (fd >= 0) {
      c.o_direct = true;
    } else if (errno == EINVAL) {
      fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      c.notes.push_back("O_DIRECT refused by the file system: the test file is buffered");
    }
    if (fd < 0) {
      const int e = errno;
      c.handle_register = fail_step(-e, fmt::format("open {}: {}", file.string(), std::strerror(e)));
      return c;
    }
    struct cleanup {
      int fd;
      std::filesystem::path f;
      ~cleanup() {
        ::close(fd);
        ::unlink(f.c_str());
      }
    } guard{fd, file};
    struct stat st {};
    if (::fstat(fd, &st) == 0) c.file_device = fmt::format("{}:{}", major(st.st_dev), minor(st.st_dev));
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      c.notes.push_back(fmt::format("ftruncate: {}", std::strerror(errno)));

    shim::CUfileError_t hs{};
    shim::cufile_handle handle(fd, hs);
    c.handle_register = hs.err == 0 ? ok_step() : fail_step(hs.err, cufile_message(hs.err));
    if (!handle) return c;

    device_buffer buf;
    try {
      buf = device_buffer(bytes, 0);
    } catch (const std::exception& e) {
      c.buf_register = fail_step(-1, fmt::format("cuMemAlloc of {} bytes: {}", bytes, e.what()));
      return c;
    }
    // The real pin: cuFileBufRegister maps GPU memory for DMA (nvidia_p2p_get_pages under nvidia-fs).
    cufile_registration reg;
    try {
      reg = cufile_registration(buf.view());
      c.buf_register = ok_step();
    } catch (const gdskit::error& e) {
      const int code = code_of(e.code());
      c.buf_register = fail_step(code, e.code().category() == cufile_category() ? cufile_message(code) : e.what());
    }

    std::vector<std::byte> host(bytes);
    const std::uint64_t salt = mode == "strict" ? 0x5757 : 0xdefa;
    for (std::uint64_t i = 0; i < bytes; ++i) host[i] = pattern_at(i, salt);
    buf.copy_from_host(host.data(), bytes);

    shim::cufile_path_counters before;
    if (stats_on) before = shim::cufile_read_counters();
    errno = 0;
    ssize_t w = a->cuFileWrite(handle.get(), buf.data(), bytes, 0, 0);
    c.write = io_step("cuFileWrite", w, errno, bytes);
    if (!c.write.succeeded()) return c;
    if (::fdatasync(fd) != 0) c.notes.push_back(fmt::format("fdatasync: {}", std::strerror(errno)));
    if (::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) c.notes.push_back("posix_fadvise(DONTNEED) failed");
    buf.fill(0);
    errno = 0;
    ssize_t r = a->cuFileRead(handle.get(), buf.data(), bytes, 0, 0);
    c.read = io_step("cuFileRead", r, errno, bytes);
    if (stats_on) {
      shim::cufile_path_counters after = shim::cufile_read_counters();
      if (before.available && after.available) c.stats = counts_delta(before, after);
      else c.notes.push_back("cuFileGetStatsL3 failed: no per-GPU counters");
    }
    if (!c.read.succeeded()) return c;
    std::vector<std::byte> back(bytes);
    buf.copy_to_host(back.data(), bytes);
    c.verified = std::memcmp(back.data(), host.data(), bytes) == 0;
    if (!c.verified) c.notes.push_back("data read back differs from the data written");
    if (!queue_depths.empty()) sweep(c, handle.get(), buf.data(), bytes, queue_depths);
  } catch (const std::exception& e) {
    c.notes.push_back(fmt::format("probe process stopped: {}", e.what()));
  } catch (...) {
    c.notes.push_back("probe process stopped by an unknown exception");
  }
  return c;
}

}  // namespace gdskit::doctor
