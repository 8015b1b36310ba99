#include "kv/volume.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "gdskit/error.hpp"

namespace gdskit::kv::detail {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(int e, const fs::path& p, const std::string& what) {
  throw error(errno_code(e), "open block store", p.string(), -1, 0, what);
}

// The process holding a flock on the file `st` describes, from /proc/locks ("1: FLOCK ADVISORY WRITE 4242
// 08:01:1234 0 EOF": device major:minor in hex, then the inode); 0 when it cannot be told.
long lock_holder(const struct stat& st) {
  std::ifstream in("/proc/locks");
  const std::string want = fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev), st.st_ino);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, type, advisory, mode, dev_ino;
    long pid = 0;
    if (!(fields >> id >> type)) continue;
    if (type == "->") fields >> type;  // a waiter, listed under the holder
    if (!(fields >> advisory >> mode >> pid >> dev_ino) || type != "FLOCK") continue;
    if (dev_ino == want) return pid;
  }
  return 0;
}

// The lock files (device, inode) this process's open stores hold: a second open in the same process is told
// apart from another process's without /proc/locks.
struct held_locks {
  std::mutex mutex;
  std::set<std::pair<dev_t, ino_t>> files;
};
held_locks& held() {
  static auto* h = new held_locks();  // never destroyed: stores may close during exit
  return *h;
}

// Takes the writer's lock on `h` (an open of its own) and returns the handle that holds it until its last owner
// lets it go. Throws EBUSY naming who holds it.
std::shared_ptr<const file_handle> take_lock(std::unique_ptr<file_handle> h, const fs::path& shown) {
  struct stat st {};
  if (::fstat(h->fd(), &st) != 0) fail(errno, shown, "fstat");
  const std::pair<dev_t, ino_t> key{st.st_dev, st.st_ino};
  for (;;) {
    if (::flock(h->fd(), LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    const int e = errno;
    if (e != EWOULDBLOCK) fail(e, shown, "flock");
    bool mine = false;
    {
      std::lock_guard lock(held().mutex);
      mine = held().files.count(key) != 0;
    }
    const long pid = mine ? 0 : lock_holder(st);
    if (mine || pid == static_cast<long>(::getpid())) {
      fail(EBUSY, shown, "the store is already open in this process (close that store first); one writer per store");
    }
    fail(EBUSY, shown,
         pid > 0 ? fmt::format("the store is open in another process (pid {}); one process writes a store at a time", pid)
                 : std::string("the store is open in another process; one process writes a store at a time"));
  }
  {
    std::lock_guard lock(held().mutex);
    held().files.insert(key);
  }
  return std::shared_ptr<const file_handle>(h.release(), [key](const file_handle* p) {
    {
      std::lock_guard lock(held().mutex);
      held().files.erase(key);
    }
    delete p;  // closes the descriptor: the lock ends
  });
}

// A store file must be a regular file (or not exist): never follow a link or open a FIFO or device there.
bool check_regular(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (ec || st.type() == fs::file_type::not_found) return false;
  if (st.type() != fs::file_type::regular) {
    fail(EINVAL, p, "not a regular file (a link, folder, FIFO or device is never used as a store file)");
  }
  return true;
}

void read_superblock(opened_volume& v) {
  std::uint8_t page[page_bytes] = {};
  std::size_t got = 0;
  got = v.file->pread(page, page_bytes, 0);
  if (got < page_bytes) {
    // A data file shorter than its superblock was not made by a finished create_volume.
    if (v.block_device) fail(EINVAL, v.data_path, "the device is smaller than 4 KiB");
    v.kind = page_kind::damaged;
    return;
  }
  v.kind = decode_superblock(std::span<const std::uint8_t, page_bytes>(page, page_bytes), v.sb);
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

opened_volume open_volume(const fs::path& path, const settings& io) {
  opened_volume v;
  v.given = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!ec && st.type() == fs::file_type::block) {
    v.block_device = true;
    v.data_path = path;
    // The lock on an open of its own: the data handle's descriptor may stay open a moment after close (a batch
    // of the transfer core lets go of its files after it is released), and the lock must end with close().
    v.lock = take_lock(std::make_unique<file_handle>(path, open_mode::read, open_options{}, io), path);
    v.file = std::make_shared<const file_handle>(path, open_mode::read_write, open_options{}, io);
    v.device_bytes = v.file->size();
    read_superblock(v);
    return v;
  }
  if (!ec && st.type() != fs::file_type::directory) {
    fail(ENOTDIR, path, "not a folder or a block device (a store lives in a folder, or on a whole block device)");
  }
  if (ec && ec != std::errc::no_such_file_or_directory) fail(ec.value(), path, "stat");
  if (ec) {
    fs::create_directories(path, ec);
    if (ec) fail(ec.value(), path, "could not create the store folder");
  }
  const fs::path lock_path = path / lock_file_name;
  check_regular(lock_path);
  open_options create;
  create.create = true;
  v.lock = take_lock(std::make_unique<file_handle>(lock_path, open_mode::read_write, create, io), path);
  // A temporary data file is what a create that did not finish leaves: never a store.
  const fs::path tmp = path / (std::string(data_file_name) + ".tmp");
  if (check_regular(tmp)) fs::remove(tmp, ec);
  v.data_path = path / data_file_name;
  if (check_regular(v.data_path)) {
    v.file = std::make_shared<const file_handle>(v.data_path, open_mode::read_write, open_options{}, io);
    read_superblock(v);
  } else {
    v.kind = page_kind::blank;
  }
  return v;
}

void create_volume(opened_volume& v, const superblock& sb, const layout& geometry, bool sync, bool preallocate,
                   const settings& io) {
  alignas(page_bytes) static thread_local std::uint8_t page[page_bytes];
  encode_superblock(sb, std::span<std::uint8_t, page_bytes>(page, page_bytes));
  if (v.block_device) {
    if (geometry.end_bytes > v.device_bytes) {
      fail(EINVAL, v.data_path, fmt::format("the device holds {} bytes; its share of the capacity needs {}",
                                            v.device_bytes, geometry.end_bytes));
    }
    // Stale checkpoints of an earlier store would fail their store id check anyway; zeroed, nothing is read.
    std::uint8_t zero[page_bytes] = {};
    v.file->pwrite(zero, page_bytes, geometry.checkpoint_position(0));
    v.file->pwrite(zero, page_bytes, geometry.checkpoint_position(1));
    v.file->pwrite(page, page_bytes, 0);
    if (sync) v.file->sync();
  } else {
    const fs::path tmp = v.data_path.parent_path() / (std::string(data_file_name) + ".tmp");
    open_options create;
    create.create = create.truncate = true;
    try {
      file_handle f(tmp, open_mode::read_write, create, io);
      // The whole capacity is reserved now (a disk too small fails here, not in a put later), and ext4 and XFS
      // run O_DIRECT writes into reserved blocks in parallel where they take turns filling holes. Where the
      // file system cannot reserve, the file is sparse and takes space as blocks are written.
      if (preallocate) {
        f.reserve(geometry.end_bytes);
      } else {
        f.truncate(geometry.end_bytes);
      }
      f.pwrite(page, page_bytes, 0);
      if (sync) f.sync();
      f.close();
      std::error_code rec;
      fs::rename(tmp, v.data_path, rec);
      if (rec) throw error(rec, "rename", tmp.string(), -1, 0, "publishing the new store's data file");
    } catch (...) {
      std::error_code ignore;
      fs::remove(tmp, ignore);
      throw;
    }
    if (sync) {
      const int dir = ::open(v.data_path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dir >= 0) {
        ::fsync(dir);
        ::close(dir);
      }
    }
    v.file = std::make_shared<const file_handle>(v.data_path, open_mode::read_write, open_options{}, io);
  }
  v.sb = sb;
  v.kind = page_kind::ok;
}

}  // namespace gdskit::kv::detail
