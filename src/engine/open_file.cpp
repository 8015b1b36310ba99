#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/arith.hpp"
#include "common/log.hpp"
#include "engine/open_file.hpp"
#include "engine/file_range.hpp"
#include "engine/io_engine.hpp"
#include "engine/residency.hpp"
#include "engine/thread_pool.hpp"
#include "engine/planner.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/fs_info.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::engine {

namespace {


int access_flags(open_mode m) {
  switch (m) {
    case open_mode::read: return O_RDONLY;
    case open_mode::write: return O_WRONLY;
    default: return O_RDWR;
  }
}

// Splits [offset, offset+nbytes) at absolute multiples of `chunk` so that every chunk but the ends is aligned.
void add_chunks(std::vector<io_task>& out, const io_task& proto, std::byte* buf, std::uint64_t offset,
                std::uint64_t end, std::size_t chunk) {
  std::uint64_t pos = offset;
  while (pos < end) {
    std::uint64_t stop = std::min(end, align_down(pos, chunk) + chunk);
    io_task t = proto;
    t.buf = buf + (pos - offset);
    t.offset = pos;
    t.nbytes = static_cast<std::size_t>(stop - pos);
    out.push_back(t);
    pos = stop;
  }
}

}  // namespace

std::vector<io_task> open_file::plan(bool write, std::byte* buf, std::size_t nbytes,
                                             std::uint64_t offset, std::size_t chunk_bytes) const {
  std::vector<io_task> tasks;
  check_file_range(write ? "pwrite" : "pread", path.native(), write, offset, nbytes);
  const std::uint64_t end = offset + nbytes;
  io_task proto;
  proto.write = write;
  proto.alignment = choice.alignment;
  if (!choice.direct) {
    proto.fd = fd.get();
    add_chunks(tasks, proto, buf, offset, end, config.chunk_bytes);
    return tasks;
  }
  const std::size_t a = choice.alignment;
  const std::uint64_t body_begin = std::min(align_up(offset, a), end);
  const std::uint64_t body_end = std::max(align_down(end, a), body_begin);
  // Partial blocks: reads go through an aligned bounce on the O_DIRECT fd; writes go through the buffered fd,
  // which the kernel merges with the block's other bytes (the alignment is at least a page, so those pages
  // never overlap an O_DIRECT range of the same request).
  io_task edge = proto;
  if (write) {
    edge.fd = fd.get();
  } else {
    edge.fd = direct_fd.get();
    edge.direct = true;
    edge.bounce = true;
  }
  if (body_begin > offset) {
    edge.buf = buf;
    edge.offset = offset;
    edge.nbytes = static_cast<std::size_t>(body_begin - offset);
    tasks.push_back(edge);
  }
  if (body_end > body_begin) {
    io_task body = proto;
    body.fd = direct_fd.get();
    body.direct = true;
    std::byte* body_buf = buf + (body_begin - offset);
    body.bounce = reinterpret_cast<std::uintptr_t>(body_buf) % a != 0;
    add_chunks(tasks, body, body_buf, body_begin, body_end, chunk_bytes);
  }
  if (end > body_end) {
    edge.buf = buf + (body_end - offset);
    edge.offset = body_end;
    edge.nbytes = static_cast<std::size_t>(end - body_end);
    tasks.push_back(edge);
  }
  if (!write) {
    for (auto& t : tasks) {
      if (prefer_page_cache(*this, t.offset, t.nbytes)) {
        t.fd = fd.get();
        t.direct = false;
        t.bounce = false;
      }
    }
  }
  return tasks;
}

void open_file::execute(std::vector<io_task>& tasks, std::size_t nbytes,
                                scheduled_transfer& sched) const {
  if (tasks.size() <= 1 || nbytes <= config.inline_bytes) {
    for (auto& t : tasks) {
      run_task(t);
      if (t.ec) break;
    }
    return;
  }
  std::size_t direct_bytes = 0;
  for (const auto& t : tasks) direct_bytes += t.direct ? t.nbytes : 0;
  if (direct_bytes == 0) {
    // Page-cache copies want every worker.
    if (choice.engine == engine_kind::io_uring && run_uring(tasks, config.threads)) return;
    run_threads(tasks, config.threads);
    return;
  }
  // Storage wants the depth the scheduler finds for this device.
  sched.start(direct_bytes);
  io_observer obs{[&sched] { return sched.shape().depth; }, [&sched](std::size_t n) { sched.complete(n); }};
  // io_uring reads into the caller's memory as it is; a destination off the O_DIRECT alignment goes through
  // per-thread bounce buffers, which the worker threads run in parallel (the ring would run them one by one on
  // the submitting thread). Partial blocks at the ends, under two alignments in all, stay with the ring.
  std::size_t bounce_bytes = 0;
  for (const auto& t : tasks) bounce_bytes += t.bounce ? t.nbytes : 0;
  const bool ring = choice.engine == engine_kind::io_uring && bounce_bytes < 2 * choice.alignment;
  if (ring && run_uring(tasks, sched.max_shape().depth, &obs)) return;
  run_threads(tasks, sched.shape().depth, &obs);
}

std::size_t open_file::transfer(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset) const {
  const bool scheduled = choice.direct && nbytes > config.inline_bytes;
  scheduled_transfer sched(config, st_dev, write ? io_dir::write : io_dir::read,
                                   io_client::host, scheduled ? nbytes : 0);
  auto tasks = plan(write, buf, nbytes, offset, scheduled ? sched.shape().request_bytes : config.chunk_bytes);
  execute(tasks, nbytes, sched);
  throw_first_error(tasks, write ? "pwrite" : "pread");
  std::size_t total = 0;
  for (const auto& t : tasks) {
    total += t.done;
    if (t.done < t.nbytes) break;  // the file ended here; nothing after it counts
  }
  return total;
}

void open_file::throw_first_error(const std::vector<io_task>& tasks, const char* op) const {
  for (const auto& t : tasks) {
    if (t.ec) throw error(t.ec, op, path.string(), static_cast<std::int64_t>(t.offset), t.nbytes);
  }
}

std::uint64_t open_file::current_size() const {
  std::error_code ec;
  const char* op = "";
  const std::uint64_t nbytes = posix::size_of(fd.get(), ec, &op);
  if (ec) throw error(ec, op, path.string(), -1, 0);
  return nbytes;
}

std::size_t open_file::read(void* buf, std::size_t nbytes, std::uint64_t offset) const {
  check_file_range("pread", path.native(), false, offset, nbytes);
  if (nbytes == 0) return 0;
  if (buf == nullptr) throw error(errno_code(EFAULT), "pread", path.string(), static_cast<std::int64_t>(offset), nbytes);
  if (mode == open_mode::write) {
    throw error(errno_code(EBADF), "pread", path.string(), static_cast<std::int64_t>(offset), nbytes,
                "file opened for writing only");
  }
  // Reads past the end return what exists: clip to the size now, and let short reads catch a shrinking file.
  const std::uint64_t size = current_size();
  if (offset >= size) return 0;
  const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(nbytes, size - offset));
  return transfer(false, static_cast<std::byte*>(buf), want, offset);
}

std::size_t open_file::write(const void* buf, std::size_t nbytes, std::uint64_t offset) const {
  check_file_range("pwrite", path.native(), true, offset, nbytes);
  if (nbytes == 0) return 0;
  if (buf == nullptr) throw error(errno_code(EFAULT), "pwrite", path.string(), static_cast<std::int64_t>(offset), nbytes);
  if (mode == open_mode::read) {
    throw error(errno_code(EBADF), "pwrite", path.string(), static_cast<std::int64_t>(offset), nbytes,
                "file opened for reading only");
  }
  const std::size_t total = transfer(true, const_cast<std::byte*>(static_cast<const std::byte*>(buf)), nbytes, offset);
  // A write never returns short: every task must account for all its bytes.
  if (total != nbytes) {
    throw error(errno_code(EIO), "pwrite", path.string(), static_cast<std::int64_t>(offset), nbytes,
                fmt::format("only {} of {} bytes were written", total, nbytes));
  }
  return nbytes;
}

namespace {

[[noreturn]] void refuse_kind(const std::filesystem::path& path, const struct stat& st) {
  throw error(errno_code(EINVAL), "open", path.string(), -1, 0,
              fmt::format("a {}: only regular files and block devices are read and written by offset",
                          posix::file_kind(st.st_mode)));
}

// Opens `path` for reading and writing by offset: a regular file or a block device, returned in blocking mode
// with its stat in `st`; `ec` set (and no descriptor) when the open itself fails. Throws at once for anything
// else: EISDIR for a folder, EINVAL naming a FIFO, socket or character device (never waited for). `look_first`:
// the path's kind is checked before the open (opening some devices does something: a tape rewinds, a watchdog
// starts); a second open of a path already checked skips it (its caller compares the two files).
posix::unique_fd open_by_offset(const std::filesystem::path& path, int flags, mode_t permissions, bool look_first,
                                struct stat& st, std::error_code& ec) {
  if (look_first && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode) &&
      !S_ISDIR(st.st_mode)) {
    refuse_kind(path, st);
  }
  posix::unique_fd fd(posix::open_without_waiting(path.c_str(), flags, permissions, st, ec));
  if (ec) return {};
  if (S_ISDIR(st.st_mode)) throw error(errno_code(EISDIR), "open", path.string(), -1, 0);
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) refuse_kind(path, st);
  if (!posix::set_blocking(fd.get())) throw error(errno_code(errno), "fcntl", path.string(), -1, 0);
  return fd;
}

}  // namespace

open_file::open_file(const std::filesystem::path& p, open_mode md, const open_options& options, const settings& cfg) {
  cfg.validate();
  open_file& m = *this;
  const std::filesystem::path& path = p;
  const open_mode mode = md;
  const settings& config = cfg;
  m.path = path;
  m.mode = mode;
  m.config = config;
  int flags = access_flags(mode);
  if (options.create) flags |= O_CREAT;
  if (options.exclusive) flags |= O_EXCL;
  if (options.truncate) {
    if (mode == open_mode::read) {
      throw error(errno_code(EINVAL), "open", path.string(), -1, 0, "truncate needs a writable mode");
    }
    flags |= O_TRUNC;
  }
  std::error_code ec;
  struct stat st {};
  m.fd = open_by_offset(path, flags, options.permissions, /*look_first=*/true, st, ec);
  if (ec) throw error(ec, "open", path.string(), -1, 0);

  const std::string fs = posix::fs_type_of(m.fd.get());
  m.st_dev = st.st_dev;
  m.fs_type = fs;
  if (config.direct == direct_mode::off) {
    m.choice.direct_reason = "GDSKIT_DIRECT=off";
  } else {
    // The second descriptor carries O_DIRECT; creation and truncation happened on the first. It must be the
    // same file: a path replaced in between is refused rather than read or written as another file.
    struct stat direct_st {};
    m.direct_fd = open_by_offset(path, access_flags(mode) | O_DIRECT, 0, /*look_first=*/false, direct_st, ec);
    if (m.direct_fd && (direct_st.st_dev != st.st_dev || direct_st.st_ino != st.st_ino)) {
      throw error(errno_code(ESTALE), "open O_DIRECT", path.string(), -1, 0, "the path was replaced while it was opened");
    }
    if (m.direct_fd) {
      m.choice.direct = true;
      m.choice.alignment = posix::direct_alignment(m.direct_fd.get());
      m.choice.direct_reason = fmt::format("O_DIRECT accepted by {}", fs);
    } else {
      m.choice.direct_reason = fmt::format("{} refuses O_DIRECT ({})", fs, ec.message());
      if (config.direct == direct_mode::on) {
        throw error(ec, "open O_DIRECT", path.string(), -1, 0, "GDSKIT_DIRECT=on but " + m.choice.direct_reason);
      }
    }
  }

  const std::string& uring_reason = uring_unavailable_reason();
  switch (config.engine) {
    case engine_kind::threads:
      m.choice.engine = engine_kind::threads;
      m.choice.engine_reason = "GDSKIT_ENGINE=threads";
      break;
    case engine_kind::io_uring:
      if (!uring_reason.empty()) {
        throw error(errno_code(ENOTSUP), "open", path.string(), -1, 0, "GDSKIT_ENGINE=io_uring but " + uring_reason);
      }
      m.choice.engine = engine_kind::io_uring;
      m.choice.engine_reason = "GDSKIT_ENGINE=io_uring";
      break;
    default:
      if (uring_reason.empty()) {
        m.choice.engine = engine_kind::io_uring;
        m.choice.engine_reason = "io_uring available";
      } else {
        m.choice.engine = engine_kind::threads;
        m.choice.engine_reason = "thread pool: " + uring_reason;
      }
  }
}

data_path open_file::route(const buffer_view& buf) const {
  if (buf.kind == memory_kind::host || buf.kind == memory_kind::pinned) return decide_path(buf).path;
  const std::size_t k = buf.kind == memory_kind::device ? 0 : 1;
  {
    std::lock_guard lock(gpu.mutex);
    if (gpu.route[k]) return *gpu.route[k];
  }
  const data_path p = decide_path(buf).path;  // takes gpu.mutex itself
  std::lock_guard lock(gpu.mutex);
  gpu.route[k] = p;
  return p;
}

path_decision open_file::decide_path(const buffer_view& buf) const {
  const open_file& f = *this;
  runtime_facts rt;
  rt.direct_ok = f.choice.direct;
  rt.direct_reason = f.choice.direct_reason;
  path_decision d;
  if (buf.kind == memory_kind::host || buf.kind == memory_kind::pinned) {
    d = decide({}, rt, buf.kind, f.config.mode);
    if (f.choice.direct && reinterpret_cast<std::uintptr_t>(buf.data) % f.choice.alignment != 0) {
      // Said of the directions this file was opened for: a save's file only writes.
      const char* moves = f.mode == open_mode::read    ? "reads"
                          : f.mode == open_mode::write ? "writes"
                                                       : "reads and writes";
      d.reasons.push_back(fmt::format("buffer not aligned to {} bytes: O_DIRECT {} go through bounce buffers "
                                      "on the worker threads (an aligned buffer saves the copy)",
                                      f.choice.alignment, moves));
    }
  } else {
    rt.gpu_ok = gpu_available(&rt.gpu_reason);
    rt.cufile_ok = shim::cufile(&rt.cufile_reason) != nullptr;
    std::lock_guard lock(f.gpu.mutex);
    if (!f.gpu.facts) f.gpu.facts = gather_facts("/", f.st_dev, f.fs_type);
    d = decide(*f.gpu.facts, rt, buf.kind, f.config.mode);
  }
  // Where the O_DIRECT depth and request size come from (profile, adaptive state, or a setting that wins),
  // for each direction the handle was opened for.
  if (f.choice.direct) {
    const auto client = d.path == data_path::staged ? io_client::staged : io_client::host;
    if (f.mode != open_mode::write) {
      d.reasons.push_back(schedule_reason(f.config, f.st_dev, io_dir::read, client));
    }
    if (f.mode != open_mode::read) {
      d.reasons.push_back(schedule_reason(f.config, f.st_dev, io_dir::write, client));
      // write_gather of several host ranges runs the staged pipeline (aligned slots) on the staged schedule.
      if (client == io_client::host) {
        d.reasons.push_back(schedule_reason(f.config, f.st_dev, io_dir::write, io_client::staged,
                                                    "gathered host writes (through aligned slots)"));
      }
    }
  }
  return d;
}

std::error_code open_file::close_all() noexcept {
  gpu.cufile.reset();  // cuFile lets go of the descriptor before it closes
  release_residency_map(*this);
  std::error_code direct_ec = direct_fd.close();
  std::error_code ec = fd.close();
  return ec ? ec : direct_ec;
}

open_file::~open_file() {
  const std::error_code ec = close_all();
  if (ec) log_warning(fmt::format("close \"{}\": {} (call file_handle::close() to see this as an error)", path.string(), ec.message()));
}

}  // namespace gdskit::engine
