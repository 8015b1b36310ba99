#include "tools/device_tune.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "engine/adaptive.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"

namespace gdskit::tools {
using engine::device_profile;
using engine::io_dir;
using engine::profile_point;

namespace {

struct aligned_buffer {
  explicit aligned_buffer(std::size_t n) {
    if (::posix_memalign(&p, 4096, n) != 0) throw error(errno_code(ENOMEM), "allocate tune buffer");
    std::memset(p, 0x5a, n);  // fault it in before anything is timed
  }
  ~aligned_buffer() { std::free(p); }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  void* p = nullptr;
};

struct removed_file {
  std::filesystem::path path;
  ~removed_file() { ::unlink(path.c_str()); }
};

settings fixed(unsigned depth, std::size_t request) {
  settings s = default_settings();
  s.adaptive = false;
  s.direct = direct_mode::on;
  s.threads = depth;
  s.direct_depth = depth;
  s.chunk_bytes = request;
  s.inline_bytes = 0;
  return s;
}

}  // namespace

device_profile tune_device(const tune_options& o) {
  std::random_device rd;
  removed_file tmp{o.dir / fmt::format(".gdskit-tune-{:08x}.tmp", rd())};
  const std::size_t n = (o.file_bytes + 4095) / 4096 * 4096;
  aligned_buffer buf(n);
  {
    // Random bytes, so no layer below can compress or deduplicate them.
    std::mt19937_64 rng(rd());
    auto* w = static_cast<std::uint64_t*>(buf.p);
    for (std::size_t i = 0; i < n / 8; ++i) w[i] = rng();
  }
  device_profile prof;
  {
    file_handle f(tmp.path, open_mode::read_write, {.create = true, .exclusive = true}, fixed(4, 4 << 20));
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0) throw error(errno_code(errno), "fstat", tmp.path.string(), -1, 0);
    prof.device = engine::identify_device("/", st.st_dev);
    f.pwrite(buf.p, n, 0);  // the file every read measurement reads
    f.sync();
  }
  prof.created = engine::utc_now_iso();
  auto measure = [&](io_dir dir, unsigned depth, std::size_t req) {
    const settings s = fixed(depth, req);
    double seconds = 0;
    if (dir == io_dir::write) {
      // A fresh file each time, as a real writer pays block allocation.
      file_handle f(tmp.path, open_mode::read_write, {.create = true, .truncate = true}, s);
      const double t0 = engine::steady_now_s();
      f.pwrite(buf.p, n, 0);
      f.sync();
      seconds = engine::steady_now_s() - t0;
    } else {
      file_handle f(tmp.path, open_mode::read, {}, s);
      f.drop_cache();
      const double t0 = engine::steady_now_s();
      f.read_exact(buf.p, n, 0);
      seconds = engine::steady_now_s() - t0;
    }
    profile_point pt{dir, {depth, req}, static_cast<double>(n) / seconds / double(1u << 30)};
    prof.sweep.push_back(pt);
    if (o.progress) o.progress(pt);
    return pt;
  };
  for (io_dir dir : {io_dir::read, io_dir::write}) {
    if (dir == io_dir::write && !o.measure_write) continue;
    profile_point best;
    for (std::size_t req : o.request_bytes) {
      for (unsigned depth : o.depths) {
        profile_point pt = measure(dir, depth, req);
        // Within 3% of the best, the smaller footprint wins: fewer bytes in flight cost less memory and cache.
        const bool smaller = static_cast<double>(pt.shape.depth) * pt.shape.request_bytes <
                             static_cast<double>(best.shape.depth) * best.shape.request_bytes;
        if (pt.gib_per_s > best.gib_per_s * 1.03 || (pt.gib_per_s >= best.gib_per_s * 0.97 && smaller)) best = pt;
      }
    }
    (dir == io_dir::read ? prof.read : prof.write) = best.shape;
    (dir == io_dir::read ? prof.read_gib_per_s : prof.write_gib_per_s) = best.gib_per_s;
  }
  if (!o.measure_write) prof.write = prof.read;
  return prof;
}

}  // namespace gdskit::tools
