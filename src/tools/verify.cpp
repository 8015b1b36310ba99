#include "tools/verify.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <optional>

#include <fmt/format.h>

#include "common/arith.hpp"
#include "tools/shell_text.hpp"
#include "tools/signal_cleanup.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::tools {
namespace {

constexpr std::size_t kHostChunk = std::size_t{64} << 20;  // upload/compare in pieces: no N-byte host copy

// Bytes of physical memory, or 0 when unknown.
std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Memory under test: GPU memory, or host memory when device < 0.
struct test_memory {
  // Host memory aligned as O_DIRECT wants it, as a program that cares would give it: the plan and the rates are
  // those of the direct path, not of bounce buffers (and the same from run to run).
  struct aligned_delete {
    void operator()(std::uint8_t* p) const noexcept { ::operator delete[](p, std::align_val_t{4096}); }
  };
  std::optional<device_buffer> dev;
  std::unique_ptr<std::uint8_t[], aligned_delete> host;
  std::size_t host_bytes = 0;
  buffer_view view;

  test_memory(std::uint64_t n, int device) {
    if (device >= 0) {
      dev.emplace(n, device);
      view = dev->view();
    } else {
      host.reset(new (std::align_val_t{4096}) std::uint8_t[n]());
      host_bytes = n;
      view = buffer_view::host(host.get(), n);
    }
  }
  void upload(const std::uint8_t* src, std::size_t n, std::size_t off) {
    if (dev) {
      dev->copy_from_host(src, n, off);
    } else {
      std::memcpy(host.get() + off, src, n);
    }
  }
  void download(std::uint8_t* dst, std::size_t n, std::size_t off) const {
    if (dev) {
      dev->copy_to_host(dst, n, off);
    } else {
      std::memcpy(dst, host.get() + off, n);
    }
  }
  void clear() {
    if (dev) {
      dev->fill(0);
    } else {
      std::memset(host.get(), 0, host_bytes);
    }
  }
};

}  // namespace

void fill_pattern(std::uint64_t seed, std::uint64_t first_index, std::uint8_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n;) {
    const std::uint64_t idx = first_index + i;
    const std::uint64_t word = splitmix(seed ^ (idx / 8 * 0x100000001B3ull));
    const std::size_t lane = idx % 8;
    const std::size_t take = std::min<std::size_t>(8 - lane, n - i);
    std::memcpy(out + i, reinterpret_cast<const std::uint8_t*>(&word) + lane, take);
    i += take;
  }
}

std::vector<verify_result> run_verify(const verify_options& o, const std::function<void(const verify_result&)>& on_result) {
  std::vector<verify_result> results;
  {
    file_handle probe(o.file, open_mode::read_write, {.create = true, .exclusive = true}, o.config);
  }
  // Registered only once the exclusive create made the file ours: an interrupt never removes a user's file.
  remove_on_signal interrupted(o.file);
  struct remover {
    const verify_options& o;
    ~remover() {
      std::error_code ec;
      if (!o.keep_file) std::filesystem::remove(o.file, ec);
    }
  } cleanup{o};
  std::vector<std::uint8_t> expect(kHostChunk), got(kHostChunk);
  for (std::uint64_t n : o.sizes) {
    verify_result r;
    r.nbytes = n;
    try {
      // Host memory larger than the machine cannot be verified: said before an allocation that the kernel might
      // grant and then kill the process for touching.
      const std::uint64_t ram = physical_memory();
      if (o.device < 0 && ram != 0 && n > ram) {
        r.error = fmt::format("could not allocate memory for {}: more than this machine's {} (try smaller --sizes)",
                              format_size(n), format_size(ram));
        if (on_result) on_result(r);
        results.push_back(std::move(r));
        continue;
      }
      test_memory mem(n, o.device);
      file_handle f(o.file, open_mode::read_write, {.truncate = true}, o.config);
      r.path = f.plan(mem.view);
      for (std::uint64_t off = 0; off < n; off += kHostChunk) {
        std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kHostChunk, n - off));
        fill_pattern(o.seed, off, expect.data(), len);
        mem.upload(expect.data(), len, static_cast<std::size_t>(off));
      }
      auto t0 = std::chrono::steady_clock::now();
      f.write(mem.view, n, o.file_offset);
      f.sync();
      r.write_gib_s = static_cast<double>(n) / (1u << 30) / seconds_since(t0);
      if (o.on_bytes) o.on_bytes(n);
      mem.clear();
      f.drop_cache();
      t0 = std::chrono::steady_clock::now();
      std::size_t read = f.read(mem.view, n, o.file_offset);
      r.read_gib_s = static_cast<double>(n) / (1u << 30) / seconds_since(t0);
      if (o.on_bytes) o.on_bytes(n);
      if (read != n) {
        r.error = fmt::format("read back {} of {} bytes", read, n);
      } else {
        r.ok = true;
        for (std::uint64_t off = 0; off < n && r.ok; off += kHostChunk) {
          std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kHostChunk, n - off));
          fill_pattern(o.seed, off, expect.data(), len);
          mem.download(got.data(), len, static_cast<std::size_t>(off));
          if (std::memcmp(expect.data(), got.data(), len) != 0) {
            std::size_t i = 0;
            while (expect[i] == got[i]) ++i;
            r.first_mismatch = static_cast<std::int64_t>(off + i);
            r.ok = false;
          }
        }
      }
    } catch (const std::bad_alloc&) {
      r.ok = false;
      r.error = fmt::format("could not allocate memory for {} (try smaller --sizes)", format_size(n));
    } catch (const std::exception& e) {
      r.ok = false;
      r.error = shown_message(e);
    }
    if (on_result) on_result(r);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace gdskit::tools
