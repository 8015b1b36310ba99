// gdskit::file_handle: the public type over the engine's open_file; every transfer goes through the core.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "api/file_access.hpp"
#include "api/routes.hpp"
#include "engine/file_range.hpp"
#include "engine/transfer/core.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/syscalls.hpp"

namespace gdskit {

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

// Checks a buffer_view request: the range fits in a file, the buffer exists and holds nbytes.
void check_view(const file_handle::impl& f, bool write, const buffer_view& buf, std::size_t nbytes, std::uint64_t offset) {
  const char* op = write ? "pwrite" : "pread";
  engine::check_file_range(op, f.path.native(), write, offset, nbytes);
  if (buf.data == nullptr && nbytes > 0) {
    throw error(errno_code(EFAULT), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes, "null buffer");
  }
  if (buf.nbytes < nbytes) {
    throw error(errno_code(EINVAL), op, f.path.string(), static_cast<std::int64_t>(offset), nbytes,
                fmt::format("buffer holds only {} bytes", buf.nbytes));
  }
}

// One range submitted as a batch: its completion is the batch's.
io_future submit_one(const file_handle& f, io_direction dir, buffer_view mem, std::size_t nbytes, std::uint64_t offset) {
  const io_range r{&f, offset, mem.sub(0, nbytes)};
  return io_future(submit(dir, std::span(&r, 1)), f.path().string(), offset, nbytes, dir == io_direction::write);
}

}  // namespace

file_handle::file_handle(const std::filesystem::path& path, open_mode mode, open_options options, const settings& config)
    : impl_(std::make_shared<impl>(path, mode, options, config)) {
  detail::ensure_routes();
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

io_future file_handle::pread_async(void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  open_impl(impl_, "pread");
  return submit_one(*this, io_direction::read, buffer_view::host(buf, nbytes), nbytes, offset_bytes);
}

io_future file_handle::pwrite_async(const void* buf, std::size_t nbytes, std::uint64_t offset_bytes) const {
  open_impl(impl_, "pwrite");
  return submit_one(*this, io_direction::write, buffer_view::host(const_cast<void*>(buf), nbytes), nbytes,
                    offset_bytes);
}

io_future file_handle::read_async(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  check_view(open_impl(impl_, "pread"), false, dst, nbytes, offset_bytes);
  return submit_one(*this, io_direction::read, dst, nbytes, offset_bytes);
}

io_future file_handle::write_async(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const {
  check_view(open_impl(impl_, "pwrite"), true, src, nbytes, offset_bytes);
  return submit_one(*this, io_direction::write, src, nbytes, offset_bytes);
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
  // A read-only handle too: the pages may be dirty from another writer (Linux syncs through any descriptor).
  if (posix::sys().fdatasync(m.fd.get()) != 0) {
    throw error(errno_code(errno), "fdatasync", m.path.string(), -1, 0, "before dropping the page cache");
  }
  int r = posix::sys().fadvise(m.fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (r != 0) throw error(errno_code(r), "posix_fadvise DONTNEED", m.path.string(), -1, 0);
}

path_decision file_handle::plan(buffer_view buf) const {
  if (!impl_) return {};
  return impl_->decide_path(buf);
}

std::size_t file_handle::read(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  const impl& m = open_impl(impl_, "pread");
  check_view(m, false, dst, nbytes, offset_bytes);
  return engine::transfer_core::instance().move(m, false, dst, nbytes, offset_bytes);
}

void file_handle::read_exact(buffer_view dst, std::size_t nbytes, std::uint64_t offset_bytes) const {
  std::size_t got = read(dst, nbytes, offset_bytes);
  if (got != nbytes) throw short_read_error(impl_->path.string(), static_cast<std::int64_t>(offset_bytes), nbytes, got);
}

std::size_t file_handle::write(buffer_view src, std::size_t nbytes, std::uint64_t offset_bytes) const {
  const impl& m = open_impl(impl_, "pwrite");
  check_view(m, true, src, nbytes, offset_bytes);
  return engine::transfer_core::instance().move(m, true, src, nbytes, offset_bytes);
}

std::size_t file_handle::write_gather(std::span<const write_extent> extents, const gather_options& options) const {
  const impl& m = open_impl(impl_, "pwrite");
  // Every extent is checked before any byte is written.
  std::vector<write_extent> sorted(extents.begin(), extents.end());
  std::erase_if(sorted, [](const write_extent& e) { return e.src.nbytes == 0; });
  if (sorted.empty()) return 0;
  const bool host = engine::host_memory(sorted.front().src);
  const int device = sorted.front().src.device;
  for (const auto& e : sorted) {
    check_view(m, true, e.src, e.src.nbytes, e.offset_bytes);
    if (engine::host_memory(e.src) != host || (!host && e.src.device != device)) {
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
  return engine::transfer_core::instance().gather(m, sorted, options);
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
