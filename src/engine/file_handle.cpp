#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "engine/file_impl.hpp"
#include "engine/file_range.hpp"
#include "engine/io_engine.hpp"
#include "engine/residency.hpp"
#include "engine/thread_pool.hpp"
#include "engine/planner.hpp"
#include "gpu/device_io.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/fs_info.hpp"
#include "posix/syscalls.hpp"

namespace gdskit {

using engine::io_task;

namespace {

std::uint64_t align_down(std::uint64_t v, std::size_t a) { return v / a * a; }
std::uint64_t align_up(std::uint64_t v, std::size_t a) { return (v + a - 1) / a * a; }

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

std::vector<io_task> file_handle::impl::plan(bool write, std::byte* buf, std::size_t nbytes,
                                             std::uint64_t offset, std::size_t chunk_bytes) const {
  std::vector<io_task> tasks;
  engine::check_file_range(write ? "pwrite" : "pread", path.string(), write, offset, nbytes);
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
      if (engine::prefer_page_cache(*this, t.offset, t.nbytes)) {
        t.fd = fd.get();
        t.direct = false;
        t.bounce = false;
      }
    }
  }
  return tasks;
}

void file_handle::impl::execute(std::vector<io_task>& tasks, std::size_t nbytes,
                                engine::scheduled_transfer& sched) const {
  if (tasks.size() <= 1 || nbytes <= config.inline_bytes) {
    for (auto& t : tasks) {
      engine::run_task(t);
      if (t.ec) break;
    }
    return;
  }
  std::size_t direct_bytes = 0;
  for (const auto& t : tasks) direct_bytes += t.direct ? t.nbytes : 0;
  if (direct_bytes == 0) {
    // Page-cache copies want every worker.
    if (choice.engine == engine_kind::io_uring && engine::run_uring(tasks, config.threads)) return;
    engine::run_threads(tasks, config.threads);
    return;
  }
  // Storage wants the depth the scheduler finds for this device.
  sched.start(direct_bytes);
  engine::io_observer obs{[&sched] { return sched.shape().depth; }, [&sched](std::size_t n) { sched.complete(n); }};
  // io_uring reads into the caller's memory as it is; a destination off the O_DIRECT alignment goes through
  // per-thread bounce buffers, which the worker threads run in parallel (the ring would run them one by one on
  // the submitting thread). Partial blocks at the ends, under two alignments in all, stay with the ring.
  std::size_t bounce_bytes = 0;
  for (const auto& t : tasks) bounce_bytes += t.bounce ? t.nbytes : 0;
  const bool ring = choice.engine == engine_kind::io_uring && bounce_bytes < 2 * choice.alignment;
  if (ring && engine::run_uring(tasks, sched.max_shape().depth, &obs)) return;
  engine::run_threads(tasks, sched.shape().depth, &obs);
}

std::size_t file_handle::impl::transfer(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset) const {
  const bool scheduled = choice.direct && nbytes > config.inline_bytes;
  engine::scheduled_transfer sched(config, st_dev, write ? engine::io_dir::write : engine::io_dir::read,
                                   engine::io_client::host, scheduled ? nbytes : 0);
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

void file_handle::impl::throw_first_error(const std::vector<io_task>& tasks, const char* op) const {
  for (const auto& t : tasks) {
    if (t.ec) throw error(t.ec, op, path.string(), static_cast<std::int64_t>(t.offset), t.nbytes);
  }
}

std::uint64_t file_handle::impl::current_size() const {
  std::error_code ec;
  const char* op = "";
  const std::uint64_t nbytes = posix::size_of(fd.get(), ec, &op);
  if (ec) throw error(ec, op, path.string(), -1, 0);
  return nbytes;
}

std::size_t file_handle::impl::read(void* buf, std::size_t nbytes, std::uint64_t offset) const {
  engine::check_file_range("pread", path.string(), false, offset, nbytes);
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

std::size_t file_handle::impl::write(const void* buf, std::size_t nbytes, std::uint64_t offset) const {
  engine::check_file_range("pwrite", path.string(), true, offset, nbytes);
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

std::error_code file_handle::impl::close_all() noexcept {
  gpu.cufile.reset();  // cuFile lets go of the descriptor before it closes
  engine::release_residency_map(*this);
  std::error_code direct_ec = direct_fd.close();
  std::error_code ec = fd.close();
  return ec ? ec : direct_ec;
}

file_handle::impl::~impl() {
  const std::error_code ec = close_all();
  if (ec) log_warning(fmt::format("close \"{}\": {} (call file_handle::close() to see this as an error)", path.string(), ec.message()));
}

// The inside of an open handle; an empty (default-constructed or moved-from) one has none.
const file_handle::impl& file_access::open_impl(const std::shared_ptr<file_handle::impl>& m, const char* op) {
  if (!m) throw error(errno_code(EBADF), op, "", -1, 0, "the file handle is not open");
  return *m;
}

file_handle::file_handle() noexcept = default;
file_handle::~file_handle() = default;
file_handle::file_handle(file_handle&&) noexcept = default;
file_handle& file_handle::operator=(file_handle&&) noexcept = default;

namespace {

const file_handle::impl& open_impl(const std::shared_ptr<file_handle::impl>& m, const char* op) {
  return file_access::open_impl(m, op);
}

// Runs `body` on the shared pool; the job holds the file open until it has run.
template <class Body>
std::future<std::size_t> run_async(std::shared_ptr<file_handle::impl> m, Body body) {
  if (m) {
    std::lock_guard lock(m->async_mutex);
    ++m->async_inflight;
  }
  auto task = std::make_shared<std::packaged_task<std::size_t()>>([m, body = std::move(body)] { return body(m); });
  auto fut = task->get_future();
  engine::shared_pool(1).submit([task, m = std::move(m)] {
    (*task)();
    if (m) {
      std::lock_guard lock(m->async_mutex);
      if (--m->async_inflight == 0) m->async_idle.notify_all();
    }
  });
  return fut;
}

}  // namespace

file_handle::file_handle(const std::filesystem::path& path, open_mode mode, open_options options, const settings& config)
    : impl_(std::make_shared<impl>()) {
  config.validate();
  impl& m = *impl_;
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
  m.fd.reset(posix::open_retry(path.c_str(), flags, options.permissions, ec));
  if (ec) throw error(ec, "open", path.string(), -1, 0);
  struct stat st {};
  if (posix::sys().fstat(m.fd.get(), &st) != 0) throw error(errno_code(errno), "fstat", path.string(), -1, 0);
  if (S_ISDIR(st.st_mode)) throw error(errno_code(EISDIR), "open", path.string(), -1, 0);

  const std::string fs = posix::fs_type_of(m.fd.get());
  m.st_dev = st.st_dev;
  m.fs_type = fs;
  if (config.direct == direct_mode::off) {
    m.choice.direct_reason = "GDSKIT_DIRECT=off";
  } else if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    m.choice.direct_reason = "not a regular file or block device";
  } else {
    // The second descriptor carries O_DIRECT; creation and truncation happened on the first.
    m.direct_fd.reset(posix::open_retry(path.c_str(), access_flags(mode) | O_DIRECT, 0, ec));
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

  const std::string& uring_reason = engine::uring_unavailable_reason();
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

std::size_t file_handle::pread(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  return open_impl(impl_, "pread").read(buf, nbytes, offset_bytes);
}

void file_handle::read_exact(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  const impl& m = open_impl(impl_, "read_exact");
  std::size_t got = m.read(buf, nbytes, offset_bytes);
  if (got != nbytes) throw short_read_error(m.path.string(), static_cast<std::int64_t>(offset_bytes), nbytes, got);
}

std::size_t file_handle::pwrite(const void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  return open_impl(impl_, "pwrite").write(buf, nbytes, offset_bytes);
}

std::future<std::size_t> file_handle::pread_async(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  return run_async(impl_, [buf, nbytes, offset_bytes](const std::shared_ptr<impl>& m) {
    return open_impl(m, "pread").read(buf, nbytes, offset_bytes);
  });
}

std::future<std::size_t> file_handle::pwrite_async(const void* buf, std::size_t nbytes,
                                                   std::uint64_t offset_bytes) const {
  return run_async(impl_, [buf, nbytes, offset_bytes](const std::shared_ptr<impl>& m) {
    return open_impl(m, "pwrite").write(buf, nbytes, offset_bytes);
  });
}

std::future<std::size_t> file_handle::read_async(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  return run_async(impl_, [dst, nbytes, offset_bytes](const std::shared_ptr<impl>& m) {
    file_handle h;  // shares the inside: the same file, open until the operation ends
    h.impl_ = m;
    return h.read(dst, nbytes, offset_bytes);
  });
}

std::future<std::size_t> file_handle::write_async(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const {
  return run_async(impl_, [src, nbytes, offset_bytes](const std::shared_ptr<impl>& m) {
    file_handle h;
    h.impl_ = m;
    return h.write(src, nbytes, offset_bytes);
  });
}

std::uint64_t file_handle::size() const { return open_impl(impl_, "fstat").current_size(); }

void file_handle::truncate(std::uint64_t nbytes) const {
  const impl& m = open_impl(impl_, "ftruncate");
  if (nbytes > engine::max_file_offset) {
    throw error(errno_code(EINVAL), "ftruncate", m.path.string(), -1, 0,
                fmt::format("length {} is past the largest file size", nbytes));
  }
  if (posix::sys().ftruncate(m.fd.get(), static_cast<off_t>(nbytes)) != 0) {
    throw error(errno_code(errno), "ftruncate", m.path.string(), static_cast<std::int64_t>(nbytes), 0);
  }
}

bool file_handle::reserve(std::uint64_t nbytes) const {
  const impl& m = open_impl(impl_, "fallocate");
  if (nbytes > engine::max_file_offset) {
    throw error(errno_code(EINVAL), "fallocate", m.path.string(), -1, 0,
                fmt::format("length {} is past the largest file size", nbytes));
  }
  if (nbytes > 0) {
    int rc;
    do {
      rc = posix::sys().fallocate(m.fd.get(), 0, 0, static_cast<off_t>(nbytes));
    } while (rc != 0 && errno == EINTR);  // tmpfs gives up on any pending signal
    if (rc == 0) return true;
    const int e = errno;
    // (The arguments were checked: EINVAL from a regular file means the file system does not reserve.)
    struct stat st {};
    const bool regular = posix::sys().fstat(m.fd.get(), &st) == 0 && S_ISREG(st.st_mode);
    const bool unsupported = e == EOPNOTSUPP || e == ENOSYS || (e == EINVAL && regular);
    if (!unsupported) throw error(errno_code(e), "fallocate", m.path.string(), 0, nbytes);
  }
  truncate(std::max(nbytes, size()));
  return false;
}

void file_handle::sync() const {
  const impl& m = open_impl(impl_, "fdatasync");
  if (posix::sys().fdatasync(m.fd.get()) != 0) throw error(errno_code(errno), "fdatasync", m.path.string(), -1, 0);
}

void file_handle::drop_cache() const {
  const impl& m = open_impl(impl_, "posix_fadvise DONTNEED");
  // Dirty pages are not dropped: write them first, and say so when that fails (the drop would not be cold).
  if (m.mode != open_mode::read && posix::sys().fdatasync(m.fd.get()) != 0) {
    throw error(errno_code(errno), "fdatasync", m.path.string(), -1, 0, "before dropping the page cache");
  }
  int r = posix::sys().fadvise(m.fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (r != 0) throw error(errno_code(r), "posix_fadvise DONTNEED", m.path.string(), -1, 0);
}

path_decision file_handle::plan(buffer_view buf) const {
  if (!impl_) return {};
  const impl& f = *impl_;
  engine::runtime_facts rt;
  rt.direct_ok = f.choice.direct;
  rt.direct_reason = f.choice.direct_reason;
  path_decision d;
  if (buf.kind == memory_kind::host || buf.kind == memory_kind::pinned) {
    d = engine::decide({}, rt, buf.kind, f.config.mode);
    if (f.choice.direct && reinterpret_cast<std::uintptr_t>(buf.data) % f.choice.alignment != 0) {
      d.reasons.push_back(fmt::format("buffer not aligned to {} bytes: O_DIRECT reads go through bounce buffers "
                                      "on the worker threads (an aligned buffer saves the copy)",
                                      f.choice.alignment));
    }
  } else {
    rt.gpu_ok = gpu_available(&rt.gpu_reason);
    rt.cufile_ok = shim::cufile(&rt.cufile_reason) != nullptr;
    std::lock_guard lock(f.gpu.mutex);
    if (!f.gpu.facts) f.gpu.facts = engine::gather_facts("/", f.st_dev, f.fs_type);
    d = engine::decide(*f.gpu.facts, rt, buf.kind, f.config.mode);
  }
  // Where the O_DIRECT depth and request size come from (profile, adaptive state, or a setting that wins),
  // for each direction the handle was opened for.
  if (f.choice.direct) {
    const auto client = d.path == data_path::staged ? engine::io_client::staged : engine::io_client::host;
    if (f.mode != open_mode::write) {
      d.reasons.push_back(engine::schedule_reason(f.config, f.st_dev, engine::io_dir::read, client));
    }
    if (f.mode != open_mode::read) {
      d.reasons.push_back(engine::schedule_reason(f.config, f.st_dev, engine::io_dir::write, client));
      // write_gather of several host ranges runs the staged pipeline (aligned slots) on the staged schedule.
      if (client == engine::io_client::host) {
        d.reasons.push_back(engine::schedule_reason(f.config, f.st_dev, engine::io_dir::write, engine::io_client::staged,
                                                    "gathered host writes (through aligned slots)"));
      }
    }
  }
  return d;
}

namespace {

bool host_memory(const buffer_view& b) { return b.kind == memory_kind::host || b.kind == memory_kind::pinned; }

// Checks a buffer_view request: the range fits in a file, the buffer exists and holds nbytes.
void check_view(const file_handle::impl& f, bool write, const buffer_view& buf, std::size_t nbytes, std::uint64_t offset) {
  const char* op = write ? "pwrite" : "pread";
  engine::check_file_range(op, f.path.string(), write, offset, nbytes);
  if (buf.data == nullptr && nbytes > 0) {
    throw error(errno_code(EFAULT), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes, "null buffer");
  }
  if (buf.nbytes < nbytes) {
    throw error(errno_code(EINVAL), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes,
                fmt::format("buffer holds only {} bytes", buf.nbytes));
  }
}

}  // namespace

std::size_t file_handle::read(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  const impl& m = open_impl(impl_, "pread");
  check_view(m, false, dst, nbytes, offset_bytes);
  if (host_memory(dst)) return m.read(dst.data, nbytes, offset_bytes);
  return gpu::device_transfer(*this, false, dst, nbytes, offset_bytes);
}

void file_handle::read_exact(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  std::size_t got = read(dst, nbytes, offset_bytes);
  if (got != nbytes) throw short_read_error(impl_->path.string(), static_cast<std::int64_t>(offset_bytes), nbytes, got);
}

std::size_t file_handle::write(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const {
  const impl& m = open_impl(impl_, "pwrite");
  check_view(m, true, src, nbytes, offset_bytes);
  if (host_memory(src)) return m.write(src.data, nbytes, offset_bytes);
  return gpu::device_transfer(*this, true, src, nbytes, offset_bytes);
}

std::size_t file_handle::write_gather(std::span<const write_extent> extents, const gather_options& options) const {
  const impl& m = open_impl(impl_, "pwrite");
  // Every extent is checked before any byte is written.
  std::vector<write_extent> sorted(extents.begin(), extents.end());
  std::erase_if(sorted, [](const write_extent& e) { return e.src.nbytes == 0; });
  if (sorted.empty()) return 0;
  const bool host = host_memory(sorted.front().src);
  const int device = sorted.front().src.device;
  for (const auto& e : sorted) {
    check_view(m, true, e.src, e.src.nbytes, e.offset_bytes);
    if (host_memory(e.src) != host || (!host && e.src.device != device)) {
      throw error(errno_code(EINVAL), "pwrite", m.path.string(), static_cast<std::int64_t>(e.offset_bytes),
                  e.src.nbytes, "a gathered write takes memory of one kind and one device");
    }
  }
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const write_extent& a, const write_extent& b) { return a.offset_bytes < b.offset_bytes; });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    const write_extent& prev = sorted[i - 1];
    if (sorted[i].offset_bytes < prev.offset_bytes + prev.src.nbytes) {
      throw error(errno_code(EINVAL), "pwrite", m.path.string(), static_cast<std::int64_t>(sorted[i].offset_bytes),
                  sorted[i].src.nbytes,
                  fmt::format("overlaps the extent of {} bytes at offset {}", prev.src.nbytes, prev.offset_bytes));
    }
  }
  if (m.mode == open_mode::read) {
    throw error(errno_code(EBADF), "pwrite", m.path.string(), static_cast<std::int64_t>(sorted.front().offset_bytes),
                sorted.front().src.nbytes, "file opened for reading only");
  }
  if (!host) return gpu::device_write_gather(*this, sorted, options);
  // Host memory, several extents, O_DIRECT: one pipeline through aligned slots, so that the joins between
  // extents fall inside aligned requests (a buffered write of a partial block waits on ext4 for every O_DIRECT
  // write in flight) and the device stays at its depth across small extents. A gather no larger than an inline
  // request is not worth the slots' memory.
  std::size_t total = 0;
  for (const auto& e : sorted) total += e.src.nbytes;
  if (sorted.size() > 1 && m.choice.direct && total > m.config.inline_bytes) {
    return gpu::host_write_gather(*this, sorted, options);
  }
  // Otherwise extent after extent, each through the engine at full depth.
  std::size_t done = 0;
  for (const auto& e : sorted) {
    if (options.cancelled && options.cancelled()) {
      throw error(errno_code(ECANCELED), "pwrite", m.path.string(), static_cast<std::int64_t>(e.offset_bytes),
                  e.src.nbytes, "cancelled");
    }
    done += m.write(e.src.data, e.src.nbytes, e.offset_bytes);
    if (options.progress) options.progress(e.src.nbytes);
  }
  return done;
}

void file_handle::close() {
  if (!impl_) return;
  std::shared_ptr<impl> m = std::move(impl_);  // the handle is empty from here on, whatever happens
  {
    std::unique_lock lock(m->async_mutex);
    m->async_idle.wait(lock, [&] { return m->async_inflight == 0; });
  }
  const std::error_code ec = m->close_all();
  if (ec) throw error(ec, "close", m->path.string(), -1, 0);
}

namespace {
const file_handle::impl& empty_impl() {
  static const file_handle::impl empty;
  return empty;
}
}  // namespace

bool file_handle::is_open() const noexcept { return impl_ && impl_->fd; }
const std::filesystem::path& file_handle::path() const noexcept { return (impl_ ? *impl_ : empty_impl()).path; }
open_mode file_handle::mode() const noexcept { return (impl_ ? *impl_ : empty_impl()).mode; }
const io_choice& file_handle::choice() const noexcept { return (impl_ ? *impl_ : empty_impl()).choice; }
const settings& file_handle::config() const noexcept { return (impl_ ? *impl_ : empty_impl()).config; }
int file_handle::fd() const noexcept { return impl_ ? impl_->fd.get() : -1; }
int file_handle::direct_fd() const noexcept { return impl_ ? impl_->direct_fd.get() : -1; }

const std::string& io_uring_unavailable_reason() { return engine::uring_unavailable_reason(); }

}  // namespace gdskit
