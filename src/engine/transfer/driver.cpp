#include "engine/transfer/driver.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "common/arith.hpp"
#include "common/idle_pool.hpp"
#include "common/key_sort.hpp"
#include "common/log.hpp"
#include "common/timespec.hpp"
#include "common/staging_epoch.hpp"
#include "engine/io_engine.hpp"
#include "engine/residency.hpp"
#include "engine/thread_pool.hpp"
#include "engine/transfer/core.hpp"
#include "engine/transfer/stream_route.hpp"
#include "gdskit/checksum.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"
#include "posix/anon_memory.hpp"
#include "posix/syscalls.hpp"

#ifdef GDSKIT_HAVE_URING
#include <liburing.h>
#endif

namespace gdskit::engine {
namespace {

using batch_ptr = std::shared_ptr<detail::batch_state>;

constexpr std::size_t k_block = 4096;

// ---- staging memory ----------------------------------------------------------------------------------------

// A host staging chunk: its mapping, announced as it goes (staging_unmapping) since rings may hold its pages.
class host_chunk {
 public:
  host_chunk() noexcept = default;
  explicit host_chunk(std::size_t nbytes) : m_(nbytes) {}
  host_chunk(host_chunk&&) noexcept = default;
  host_chunk& operator=(host_chunk&& o) noexcept {
    if (this != &o) {
      retire();
      m_ = std::move(o.m_);
    }
    return *this;
  }
  ~host_chunk() { retire(); }
  std::byte* data() const noexcept { return static_cast<std::byte*>(m_.data()); }
  std::size_t size() const noexcept { return m_.size(); }

 private:
  void retire() noexcept {
    if (m_.data() != nullptr) staging_unmapping();
  }
  posix::anon_memory m_;
};

// Idle host staging chunks of the drivers that ended, for the next ones, by size: a batch of a few small ranges
// (a KV get) would otherwise map, fault in and zero a chunk for each call, which costs more than its reads. With
// a hundred calls in flight that was most of the process's CPU.
class host_chunks {
 public:
  static constexpr std::size_t k_idle_cap_bytes = std::size_t{256} << 20;  // kept idle, at most

  static host_chunks& instance() {
    static host_chunks* p = new host_chunks();  // never destroyed: drivers may end during exit
    return *p;
  }
  host_chunk take(std::size_t nbytes) {
    if (std::optional<host_chunk> m = idle_.take(nbytes)) return std::move(*m);
    host_chunk m(nbytes);
    mapped_chunks_.fetch_add(1, std::memory_order_relaxed);
    mapped_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
    return m;
  }
  void give(host_chunk m) noexcept {
    const std::size_t n = m.size();
    idle_.give(n, n, std::move(m));
  }
  void trim() noexcept { idle_.clear(); }
  host_staging_counters counters() {
    host_staging_counters c;
    c.chunks_mapped = mapped_chunks_.load(std::memory_order_relaxed);
    c.bytes_mapped = mapped_bytes_.load(std::memory_order_relaxed);
    c.idle_bytes = idle_.idle_bytes();
    return c;
  }

 private:
  idle_pool<std::size_t, host_chunk> idle_{k_idle_cap_bytes};
  std::atomic<std::uint64_t> mapped_chunks_{0}, mapped_bytes_{0};
};

// Where staging chunks are entered, so that requests through them need no pinning of pages per request
// (io_uring's registered buffers). enter() holds a chunk's entry for a driver (making it where there is none):
// a slot number, or -1 where the chunk cannot be entered; leave() lets go of it. Entries outlive the drivers
// that held them: chunks come back from the pools to the next batches of the thread, already entered.
class buffer_table {
 public:
  virtual ~buffer_table() = default;
  virtual int enter(std::byte* p, std::size_t nbytes) noexcept = 0;
  virtual void leave(int slot) noexcept = 0;
};

std::atomic<std::uint64_t> g_fixed_requests{0};  // requests through registered staging, over the process
std::atomic<std::uint64_t> g_fixed_file_requests{0};  // requests on registered files, over the process

// Slots of 4 KiB << k carved from chunks of 2 MiB (one huge page), or of one slot where slots are larger, kept
// per size on free lists. Chunks come from the group copier (pinned, for GPU memory) or anonymous memory (host
// bounces, kept idle across drivers by host_chunks), and go back when the driver ends. Chunks of few sizes are
// what lets the idle pools serve the next batches: a batch that keeps one 2 MiB request in flight (one of a
// hundred KV calls side by side) takes 2 MiB, not a chunk sized for a loader's batch 64 requests deep.
class staging {
 public:
  static constexpr std::size_t k_chunk = std::size_t{2} << 20;
  static constexpr unsigned k_classes = 13;  // 4 KiB .. 16 MiB

  explicit staging(group_copier* device) : device_(device) {}
  ~staging() {
    const std::shared_ptr<buffer_table> table = table_.lock();
    for (auto& c : chunks_) {
      // The entry stays for the thread's next batches; a chunk unmapped now (below, or later by its pool) is
      // announced, and the table then drops the entry before it enters anything else.
      if (c.fixed >= 0 && table) table->leave(c.fixed);
      if (device_ != nullptr) {
        if (reusable_) {
          device_->give_chunk(c.data, c.nbytes);
        } else {
          device_->discard_chunk(c.data, c.nbytes);
        }
      } else if (reusable_) {
        host_chunks::instance().give(std::move(c.host));
      }  // else unmapped here: a request the kernel may still hold keeps its pages, and no later batch sees them
    }
  }
  // Once every request the driver started has ended for certain: its chunks may serve later batches (else
  // they are freed: a request the kernel still holds keeps the pages it pinned, and nothing reuses them).
  void mark_reusable() noexcept { reusable_ = true; }
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;

  static unsigned class_of(std::size_t nbytes) {
    unsigned k = 0;
    while ((k_block << k) < nbytes) ++k;
    return k;
  }
  /// The bytes of a chunk for slots of class `k`.
  static std::size_t chunk_bytes(unsigned k) { return std::max(k_chunk, k_block << k); }
  // A slot of at least `nbytes` (<= 16 MiB), 4 KiB aligned; nullptr when no chunk can be had.
  std::byte* take(std::size_t nbytes) {
    const unsigned k = class_of(nbytes);
    auto& list = free_[k];
    if (list.empty() && !carve(k)) return nullptr;
    std::byte* p = list.back();
    list.pop_back();
    return p;
  }
  void give(std::byte* p, std::size_t nbytes) { free_[class_of(nbytes)].push_back(p); }

  /// Chunks carved from now on are entered in `table` (for as long as it lives).
  void enter_into(std::weak_ptr<buffer_table> table) { table_ = std::move(table); }
  /// The table slot of the chunk that holds slot `p`, or -1 (not entered).
  int fixed_index(const std::byte* p) const noexcept {
    for (auto it = chunks_.rbegin(); it != chunks_.rend(); ++it) {
      if (p >= it->data && p < it->data + it->nbytes) return it->fixed;
    }
    return -1;
  }

 private:
  struct chunk {
    std::byte* data = nullptr;
    std::size_t nbytes = 0;
    host_chunk host;  // host chunks: the mapping
    int fixed = -1;           // its slot in the table, or -1
  };
  bool carve(unsigned k) {
    const std::size_t bytes = chunk_bytes(k);
    chunk c;
    c.nbytes = bytes;
    if (device_ != nullptr) {
      c.data = device_->take_chunk(bytes);
      if (c.data == nullptr) return false;
    } else {
      try {
        c.host = host_chunks::instance().take(bytes);
        c.data = c.host.data();
      } catch (const std::exception&) {
        return false;
      }
    }
    const std::size_t slot = k_block << k;
    try {
      free_[k].reserve(free_[k].size() + bytes / slot);
      chunks_.push_back(std::move(c));
    } catch (...) {
      if (device_ != nullptr) {
        device_->give_chunk(c.data, bytes);
      } else {
        host_chunks::instance().give(std::move(c.host));
      }
      return false;
    }
    std::byte* base = chunks_.back().data;
    if (const std::shared_ptr<buffer_table> table = table_.lock()) chunks_.back().fixed = table->enter(base, bytes);
    for (std::size_t off = 0; off + slot <= bytes; off += slot) free_[k].push_back(base + off);
    return true;
  }

  group_copier* device_;
  std::weak_ptr<buffer_table> table_;
  bool reusable_ = false;
  std::vector<chunk> chunks_;
  std::vector<std::byte*> free_[k_classes];
};

// Bytes and requests in flight on each device, over every batch driver of the process. The bytes a device's
// scheduler keeps in flight, and the default depth, are the device's budget, not each batch's: batches that run
// side by side (the calls of a KV store's callers) share them, so that together they queue no more on the device
// than one batch would. A device past its best depth loses rate: a RAM-backed loop device reads 2 MiB requests
// at 5.0 GiB/s 16 deep and at 3.6 GiB/s 32 deep. Each driver that still has requests to start keeps at most an
// equal share of both (a driver only looks again when one of its own requests ends, so without shares the first
// to fill the budget would keep it), and always one request; a driver whose last requests are in flight leaves
// its share to the others.
class device_share {
 public:
  device_share() = default;
  ~device_share() {
    if (dev_ == nullptr) return;
    dev_->bytes.fetch_sub(mine_, std::memory_order_relaxed);  // what was never taken back
    dev_->requests.fetch_sub(mine_requests_, std::memory_order_relaxed);
    wanting(false);
  }
  device_share(const device_share&) = delete;
  device_share& operator=(const device_share&) = delete;

  /// Counts this driver's requests against `dev`'s totals from now on.
  void attach(dev_t dev) {
    dev_ = &counters(dev);
    wanting(true);
  }
  /// This driver's share of `depth` requests now (all of it when not attached).
  std::size_t depth_share(std::size_t depth) const noexcept {
    if (dev_ == nullptr) return depth;
    return std::max<std::size_t>(1, depth / std::max<std::size_t>(1, dev_->drivers.load(std::memory_order_relaxed)));
  }
  /// Whether this driver has requests still to start: only such drivers divide the device's budget.
  void wanting(bool w) noexcept {
    if (dev_ == nullptr || w == wanting_) return;
    wanting_ = w;
    if (w) {
      dev_->drivers.fetch_add(1, std::memory_order_relaxed);
    } else {
      dev_->drivers.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  /// Whether one more request of `nbytes` keeps this driver within its share of `budget` bytes and `depth`
  /// requests, and the device within both.
  bool fits(std::size_t nbytes, std::size_t budget, std::size_t depth) const noexcept {
    if (mine_requests_ == 0) return true;  // one request always: no batch waits on another
    if (dev_ == nullptr) return mine_ + nbytes <= budget && mine_requests_ < depth;
    const std::size_t drivers = std::max<std::size_t>(1, dev_->drivers.load(std::memory_order_relaxed));
    const std::size_t share = budget / drivers;
    const std::size_t share_depth = std::max<std::size_t>(1, depth / drivers);
    return mine_ + nbytes <= std::max(share, nbytes) && mine_requests_ < share_depth &&
           dev_->bytes.load(std::memory_order_relaxed) + nbytes <= budget &&
           dev_->requests.load(std::memory_order_relaxed) < depth;
  }
  void add(std::size_t nbytes) noexcept {
    mine_ += nbytes;
    ++mine_requests_;
    if (dev_ != nullptr) {
      dev_->bytes.fetch_add(nbytes, std::memory_order_relaxed);
      dev_->requests.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void remove(std::size_t nbytes) noexcept {
    mine_ -= nbytes;
    --mine_requests_;
    if (dev_ != nullptr) {
      dev_->bytes.fetch_sub(nbytes, std::memory_order_relaxed);
      dev_->requests.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  struct device {
    std::atomic<std::size_t> bytes{0};
    std::atomic<std::size_t> requests{0};
    std::atomic<std::size_t> drivers{0};  // those with requests still to start
  };
  static device& counters(dev_t dev) {
    static std::mutex mutex;
    static auto* devices = new std::map<dev_t, std::unique_ptr<device>>();  // never destroyed
    std::lock_guard lock(mutex);
    auto& d = (*devices)[dev];
    if (!d) d = std::make_unique<device>();
    return *d;
  }

  device* dev_ = nullptr;
  std::size_t mine_ = 0;
  std::size_t mine_requests_ = 0;
  bool wanting_ = false;
};

// ---- requests ------------------------------------------------------------------------------------------------

// Where part of a request's bytes belong: `nbytes` at `req_off` of the request's logical range, for range
// `range` at `range_off` of it.
struct delivery {
  std::size_t range = 0;
  std::size_t range_off = 0;
  std::size_t req_off = 0;
  std::size_t nbytes = 0;
};

// A read part's copy into GPU memory: not (any more) to be copied, waiting for its group to go out, queued
// under the range's claim, or decided by the copy callback when it landed.
enum class copy_state : std::uint8_t { none, awaiting_group, queued, decided_on_landing };

struct request {
  const open_file* file = nullptr;
  bool write = false;
  // The logical range: the bytes the ranges want.
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
  // What the kernel is asked: `io_nbytes` at `io_offset` on `fd`, into or from `buf`.
  int fd = -1;
  bool direct = false;
  std::uint64_t io_offset = 0;
  std::size_t io_nbytes = 0;
  std::byte* buf = nullptr;
  bool staged = false;       // buf is a staging slot (not the caller's memory)
  int fixed = -1;            // staging in the ring's table of registered buffers: its slot there
  std::size_t done = 0;      // bytes the kernel has moved so far
  bool split = false;        // one of several requests of a range
  bool to_device = false;    // the ranges' memory is GPU memory (copies through the group copier)
  std::size_t active_at = SIZE_MAX;  // its place among the executor's requests in flight
  std::vector<delivery> parts;
  std::vector<copy_state> claimed;     // reads to GPU memory: where each part's copy stands
  std::vector<std::uint32_t> crcs;     // checksummed reads: each part's CRC32C
  std::uint32_t crc = 0;               // checksummed writes (one range): the CRC32C of the bytes written
  std::error_code ec;
  bool eof = false;
  std::chrono::steady_clock::time_point issued{};  // first submission to the kernel
};

// Bytes of the logical range present after the kernel moved `done` bytes of the request (reads).
std::size_t logical_got(const request& r) {
  const std::size_t head = static_cast<std::size_t>(r.offset - r.io_offset);
  return r.done > head ? std::min(r.done - head, r.nbytes) : 0;
}

// Requests of one driver, reused: a request goes back once finished and comes out again with its lists emptied
// but their room kept, so that a batch of a million small reads allocates no memory per read. The pool owns
// every request it made until it goes.
class request_pool {
 public:
  request& take() {
    if (free_.empty()) {
      all_.push_back(std::make_unique<request>());
      return *all_.back();
    }
    request* r = free_.back();
    free_.pop_back();
    return *r;
  }
  void give(request& r) {
    std::vector<delivery> parts = std::move(r.parts);
    std::vector<copy_state> claimed = std::move(r.claimed);
    std::vector<std::uint32_t> crcs = std::move(r.crcs);
    r = request{};
    parts.clear();
    claimed.clear();
    crcs.clear();
    r.parts = std::move(parts);
    r.claimed = std::move(claimed);
    r.crcs = std::move(crcs);
    free_.push_back(&r);
  }

 private:
  std::vector<std::unique_ptr<request>> all_;
  std::vector<request*> free_;
};

// ---- executors -------------------------------------------------------------------------------------------------

// Runs kernel requests and reports them finished; wait() also returns when the driver's wake descriptor or the
// batch's stop descriptor becomes readable.
class executor {
 public:
  virtual ~executor() = default;
  virtual void submit(request* r) = 0;
  /// Withdraws requests not yet started; asks the kernel to end those it holds.
  virtual void cancel_all() = 0;
  virtual std::size_t inflight() const = 0;
  /// Blocks until at least one request finished or a descriptor woke it, or for at most `limit` when it is
  /// not zero; appends finished requests to `out`. True when the time ran out with nothing else to report.
  virtual bool wait(std::vector<request*>& out, std::chrono::nanoseconds limit = {}) = 0;
  /// Whether wait() can be given a limit (false where it cannot time its waits, or the kernel refused one).
  virtual bool timed_waits() const { return true; }
  /// Hands the requests submitted so far to the kernel now where the executor would do so only in wait().
  virtual void submit_now() {}
  /// True once requests were reported finished that the kernel may still hold (a ring that stopped answering).
  virtual bool abandoned() const { return false; }
};

// Issues the remainder of a request again after a short transfer, or ends it: true when it is finished.
bool account(request& r, int res) {
  if (res < 0) {
    r.ec = std::error_code(-res, std::generic_category());
    return true;
  }
  if (res == 0) {
    if (r.write) {
      r.ec = std::error_code(ENOSPC, std::generic_category());
    } else {
      r.eof = true;
    }
    return true;
  }
  r.done += static_cast<std::size_t>(res);
  if (r.done >= r.io_nbytes) return true;
  // A short O_DIRECT read that stops off a block boundary has reached the end of the file.
  if (!r.write && r.direct && (r.io_offset + r.done) % k_block != 0) {
    r.eof = true;
    return true;
  }
  return false;
}

class thread_executor final : public executor {
 public:
  thread_executor(unsigned workers, int wake_fd, int stop_fd)
      : wake_fd_(wake_fd), stop_fd_(stop_fd), hold_(workers) {
    st_ = std::make_shared<shared>();
    st_->wake_fd = wake_fd;
    // The workers hold threads of the shared pool for the driver's life (as the driver holds its own): the
    // pool keeps one for each, or batches side by side would queue their workers behind each other's.
    st_->workers = workers;
    for (unsigned w = 0; w < workers; ++w) shared_pool(1).submit([st = st_] { work(*st); });
  }
  ~thread_executor() override {
    {
      std::lock_guard lock(st_->mutex);
      st_->closing = true;
    }
    st_->cv.notify_all();
    // Workers hold the shared state; none touches a request once it is handed back, and every request was
    // waited for before the driver ends.
  }

  void submit(request* r) override {
    {
      std::lock_guard lock(st_->mutex);
      st_->queue.push_back(r);
      ++inflight_;
    }
    st_->cv.notify_one();
  }
  void cancel_all() override {
    std::lock_guard lock(st_->mutex);
    for (request* r : st_->queue) {
      r->ec = errno_code(ECANCELED);
      st_->finished.push_back(r);
    }
    st_->queue.clear();
  }
  std::size_t inflight() const override { return inflight_; }
  bool wait(std::vector<request*>& out, std::chrono::nanoseconds limit) override {
    for (;;) {
      {
        std::unique_lock lock(st_->mutex);
        if (!st_->finished.empty()) {
          inflight_ -= st_->finished.size();
          out.insert(out.end(), st_->finished.begin(), st_->finished.end());
          st_->finished.clear();
          return false;
        }
        if (st_->started == 0 && !st_->queue.empty()) {
          // The workers are jobs of the shared pool, and no thread of it has taken one yet: the drivers of other
          // batches may hold every thread, each waiting like this one. The driver runs a request itself, so that
          // every batch moves however busy the pool is.
          request* r = st_->queue.front();
          st_->queue.pop_front();
          lock.unlock();
          run_one(*r);
          --inflight_;
          out.push_back(r);
          return false;
        }
      }
      // The stop descriptor stays readable once the batch stops: it wakes this wait once, then only the
      // driver's own descriptor does (requests still running, copies still landing).
      pollfd p[2] = {{wake_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      const timespec ts = to_timespec(limit);
      const int n = ::ppoll(p, stop_seen_ ? 1 : 2, limit.count() > 0 ? &ts : nullptr, nullptr);
      if (n < 0 && errno != EINTR) throw error(errno_code(errno), "poll", "", -1, 0, "batch driver");
      if (n == 0) return true;  // the time ran out (the workers wake the descriptor for each request they end)
      drain_eventfd(wake_fd_);
      if (!stop_seen_ && n > 0 && (p[1].revents & POLLIN) != 0) {
        stop_seen_ = true;
        return false;  // the batch stops: the driver decides what to withdraw
      }
      if (n > 0 && (p[0].revents & POLLIN) != 0) {
        std::lock_guard lock(st_->mutex);
        if (st_->finished.empty()) return false;  // woken for something else (copies)
      }
    }
  }

  static void drain_eventfd(int fd) {
    std::uint64_t v;
    while (::read(fd, &v, sizeof v) > 0) {
    }
  }

 private:
  struct shared {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<request*> queue;
    std::vector<request*> finished;
    bool closing = false;
    unsigned workers = 0;
    unsigned started = 0;  // workers that got a thread of the pool
    int wake_fd = -1;
  };
  // Moves a request's bytes until it is finished (short transfers continued, EINTR retried).
  static void run_one(request& r) {
    for (;;) {
      const std::size_t left = r.io_nbytes - r.done;
      const auto at = static_cast<off_t>(r.io_offset + r.done);
      const ssize_t n = r.write ? posix::sys().pwrite(r.fd, r.buf + r.done, left, at)
                                : posix::sys().pread(r.fd, r.buf + r.done, left, at);
      if (n < 0 && errno == EINTR) continue;
      if (account(r, n < 0 ? -errno : static_cast<int>(n))) return;
    }
  }
  static void work(shared& s) {
    {
      std::lock_guard lock(s.mutex);
      ++s.started;
    }
    for (;;) {
      request* r = nullptr;
      {
        std::unique_lock lock(s.mutex);
        s.cv.wait(lock, [&] { return s.closing || !s.queue.empty(); });
        if (s.queue.empty()) return;
        r = s.queue.front();
        s.queue.pop_front();
      }
      run_one(*r);
      std::lock_guard lock(s.mutex);
      s.finished.push_back(r);
      // Still under the lock: once the driver has taken the request it may end and close the descriptor (whose
      // number may then be another file's).
      const std::uint64_t one = 1;
      (void)!::write(s.wake_fd, &one, sizeof one);
    }
  }

  std::shared_ptr<shared> st_;
  int wake_fd_, stop_fd_;
  pool_hold hold_;  // the pool threads its workers hold
  bool stop_seen_ = false;
  std::size_t inflight_ = 0;
};

#ifdef GDSKIT_HAVE_URING

// One ring per driver thread, reused across batches: its size is fixed, the driver's depth is capped to it.
constexpr unsigned k_ring_entries = 256;
constexpr std::uint64_t k_tag_wake = 1, k_tag_stop = 2, k_tag_cancel = 3;  // request pointers are never this small

// Bytes of staging registered with io_uring over the process, and the most it may be: registered buffers count
// against the memory-lock limit of a user without CAP_IPC_LOCK, which other users of locked memory share.
std::atomic<std::uint64_t> g_registered_bytes{0};

std::uint64_t registration_cap() {
  static const std::uint64_t cap = [] {
    rlimit l{};
    if (::getrlimit(RLIMIT_MEMLOCK, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return static_cast<std::uint64_t>(l.rlim_cur) / 2;
  }();
  return cap;
}

std::atomic<std::uint64_t> g_chunks_entered{0}, g_entries_reused{0};  // over the process
// Bytes of the entries no driver holds, over every ring of the process.
std::atomic<std::uint64_t> g_kept_bytes{0};

struct ring_holder final : buffer_table {
  static constexpr unsigned k_fixed_slots = 1024;
  // Entries no driver holds are kept for the thread's next batches within three bounds (the least recently used
  // go first): this many bytes per ring (the staging of a batch of 2 MiB reads 32 deep), this many over the
  // process (what the staging pools themselves keep idle), and only while the process's registrations take at
  // most half of what they may (a quarter of the memory-lock limit), so that one thread's kept entries never
  // leave another thread's batch without room: only this thread can empty them. An entry whose chunk was
  // unmapped keeps its pages with the kernel until this thread's next batch enters a chunk, within those bounds.
  static constexpr std::size_t k_kept_per_ring = std::size_t{64} << 20;
  static constexpr std::size_t k_kept_per_process = std::size_t{256} << 20;
  io_uring ring{};
  bool ok = false;
  bool fixed = false;                 // a sparse table of registered buffers was set up, and is usable
  bool table_failed = false;          // an entry could not be emptied: the ring is replaced at the next batch
  std::vector<unsigned> free_slots;   // its empty entries
  struct entry {
    std::byte* base = nullptr;
    std::size_t nbytes = 0;
    unsigned slot = 0;
    unsigned held = 0;       // drivers of this thread that hold it
    std::uint64_t used = 0;  // when it was last entered, on `clock`
  };
  std::vector<entry> entries;
  // A sparse table of registered files: a request on a registered file skips the kernel's lookup of the
  // descriptor and its reference count (a twentieth of the driver thread's CPU per 4 KiB read). Each driver
  // enters the descriptors its requests use and empties those entries when it ends.
  static constexpr unsigned k_file_slots = 64;
  bool files = false;
  std::vector<unsigned> free_file_slots;
  std::size_t entered_bytes = 0;  // every entry, held or not
  std::size_t kept_bytes = 0;     // entries no driver holds
  std::uint64_t clock = 0;
  std::uint64_t epoch_seen = 0;
  // Only the thread that made the ring submits to it and reaps it (the ring is the thread's): completions run
  // when it asks for them instead of interrupting it as they come, which costs a quarter less CPU per 4 KiB
  // read and raised a RAM loop device's batches of them by a fifth. Kernels before 6.1 refuse the flags.
  ring_holder() {
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    ok = io_uring_queue_init_params(k_ring_entries + 8, &ring, &p) == 0;
    if (!ok) ok = io_uring_queue_init(k_ring_entries + 8, &ring, 0) == 0;
    // Kernels before 5.19 have no sparse tables: staging then goes as any memory does.
    if (ok && io_uring_register_buffers_sparse(&ring, k_fixed_slots) == 0) {
      fixed = true;
      free_slots.reserve(k_fixed_slots);
      entries.reserve(k_fixed_slots);
      for (unsigned k = k_fixed_slots; k-- > 0;) free_slots.push_back(k);
      epoch_seen = staging_unmap_epoch().load(std::memory_order_seq_cst);
    }
    if (ok && io_uring_register_files_sparse(&ring, k_file_slots) == 0) {
      files = true;
      for (unsigned k = k_file_slots; k-- > 0;) free_file_slots.push_back(k);
    }
  }
  ~ring_holder() override {
    if (!ok) return;
    io_uring_queue_exit(&ring);  // the table goes with the ring
    g_registered_bytes.fetch_sub(entered_bytes, std::memory_order_relaxed);
    g_kept_bytes.fetch_sub(kept_bytes, std::memory_order_relaxed);
  }
  // Registering pins the chunk's pages once (the kernel refuses memory it cannot pin for long, and a user
  // past the memory-lock limit): -1 then, and the chunk's requests pin per request.
  int enter(std::byte* p, std::size_t nbytes) noexcept override {
    if (!fixed || !default_settings().registered_staging) return -1;
    // Memory unmapped since the last look may be mapped again at an address an entry has: entries no driver
    // holds are dropped (those held are of chunks still mapped).
    if (const std::uint64_t e = staging_unmap_epoch().load(std::memory_order_seq_cst); e != epoch_seen) {
      epoch_seen = e;
      for (std::size_t i = entries.size(); i-- > 0;) {
        if (entries[i].held == 0) drop(i);
      }
      if (!fixed) return -1;
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      entry& x = entries[i];
      if (x.base != p) continue;
      if (x.held > 0 && x.nbytes != nbytes) return -1;  // cannot happen: a held chunk is mapped once
      if (x.nbytes != nbytes) {
        drop(i);
        break;
      }
      if (x.held++ == 0) unkeep(x.nbytes);
      x.used = ++clock;
      g_entries_reused.fetch_add(1, std::memory_order_relaxed);
      return static_cast<int>(x.slot);
    }
    // A free slot, by dropping the entry used longest ago that no driver holds.
    while (fixed && free_slots.empty()) {
      if (!drop_oldest_kept()) return -1;  // every entry held: this chunk goes as any memory does
    }
    if (!fixed) return -1;
    if (g_registered_bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes > registration_cap()) {
      g_registered_bytes.fetch_sub(nbytes, std::memory_order_relaxed);
      return -1;
    }
    const unsigned k = free_slots.back();
    iovec v{p, nbytes};
    if (io_uring_register_buffers_update_tag(&ring, k, &v, nullptr, 1) != 1) {
      g_registered_bytes.fetch_sub(nbytes, std::memory_order_relaxed);
      return -1;
    }
    free_slots.pop_back();
    entries.push_back({p, nbytes, k, 1, ++clock});  // reserved for every slot: no allocation
    entered_bytes += nbytes;
    g_chunks_entered.fetch_add(1, std::memory_order_relaxed);
    return static_cast<int>(k);
  }
  void leave(int slot) noexcept override {
    for (entry& x : entries) {
      if (x.slot != static_cast<unsigned>(slot) || x.held == 0) continue;
      if (--x.held == 0) keep(x.nbytes);
      break;
    }
    while (over_kept() && drop_oldest_kept()) {
    }
  }

 private:
  void keep(std::size_t n) noexcept {
    kept_bytes += n;
    g_kept_bytes.fetch_add(n, std::memory_order_relaxed);
  }
  void unkeep(std::size_t n) noexcept {
    kept_bytes -= n;
    g_kept_bytes.fetch_sub(n, std::memory_order_relaxed);
  }
  bool over_kept() const noexcept {
    return kept_bytes > k_kept_per_ring || g_kept_bytes.load(std::memory_order_relaxed) > k_kept_per_process ||
           g_registered_bytes.load(std::memory_order_relaxed) > registration_cap() / 2;
  }
  bool drop_oldest_kept() noexcept {
    std::size_t oldest = entries.size();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].held == 0 && (oldest == entries.size() || entries[i].used < entries[oldest].used)) oldest = i;
    }
    if (oldest == entries.size()) return false;
    drop(oldest);
    return true;
  }
  // Empties the slot of entry `i`, which no driver holds: the kernel lets go of its pages once the requests that
  // used them have ended.
  void drop(std::size_t i) noexcept {
    const entry x = entries[i];
    entries[i] = entries.back();
    entries.pop_back();
    unkeep(x.nbytes);
    iovec v{nullptr, 0};
    if (io_uring_register_buffers_update_tag(&ring, x.slot, &v, nullptr, 1) != 1) {
      // An entry that cannot be emptied keeps its pages (counted) until the ring goes, which is at the thread's
      // next batch: the table is not used again.
      fixed = false;
      table_failed = true;
      return;
    }
    entered_bytes -= x.nbytes;
    g_registered_bytes.fetch_sub(x.nbytes, std::memory_order_relaxed);
    free_slots.push_back(x.slot);  // reserved for every slot: no allocation
  }
};
thread_local std::shared_ptr<ring_holder> tls_driver_ring;

ring_holder* driver_ring() {
  // A ring whose table failed is replaced once no batch uses it (the driver that asks for it is the thread's
  // only one): its pages go with it.
  if (!tls_driver_ring || !tls_driver_ring->ok || tls_driver_ring->table_failed) {
    tls_driver_ring.reset();
    tls_driver_ring = std::make_shared<ring_holder>();
  }
  return tls_driver_ring->ok ? tls_driver_ring.get() : nullptr;
}

class uring_executor final : public executor {
 public:
  uring_executor(ring_holder* h, int wake_fd, int stop_fd) : h_(h), r_(&h->ring), wake_fd_(wake_fd), stop_fd_(stop_fd) {
    arm(wake_fd_, k_tag_wake);
    arm(stop_fd_, k_tag_stop);
  }
  ~uring_executor() override {
    if (broken_ || inflight_ > 0) {
      // Entries the kernel refused are still queued in the ring: it must never submit them; or requests are
      // still in the kernel (a driver that failed and could not wait for them): their completions must never
      // reach the thread's next batch. That batch gets a fresh ring; this one's requests are cancelled as it
      // goes.
      tls_driver_ring.reset();
      return;
    }
    // Leave the ring as found: withdraw the two polls and reap everything.
    for (std::uint64_t tag : {k_tag_wake, k_tag_stop}) {
      if (!(tag == k_tag_wake ? wake_armed_ : stop_armed_)) continue;
      io_uring_sqe* sqe = get_sqe();
      io_uring_prep_cancel64(sqe, tag, 0);
      io_uring_sqe_set_data64(sqe, k_tag_cancel);
      ++pending_control_;
    }
    while (pending_control_ > 0 || wake_armed_ || stop_armed_) {
      if (posix::sys().uring_submit_and_wait(r_, 1) < 0) {
        tls_driver_ring.reset();
        return;
      }
      reap(nullptr);
    }
    // The files this driver entered leave the table (a request still in the kernel keeps its file itself).
    for (const auto& [fd, slot] : files_) {
      const int none = -1;
      if (io_uring_register_files_update(r_, slot, &none, 1) != 1) {
        tls_driver_ring.reset();  // an entry that stays would keep its file open: the ring goes instead
        return;
      }
      h_->free_file_slots.push_back(slot);
    }
  }

  void submit(request* r) override {
    ++inflight_;
    if (broken_) {
      r->ec = submit_error_;
      refused_.push_back(r);
      return;
    }
    r->active_at = active_.size();
    active_.push_back(r);
    prep(r);
  }
  void cancel_all() override {
    if (broken_) return;
    for (request* r : active_) {
      io_uring_sqe* sqe = get_sqe();
      io_uring_prep_cancel64(sqe, reinterpret_cast<std::uint64_t>(r), 0);
      io_uring_sqe_set_data64(sqe, k_tag_cancel);
      ++pending_control_;
    }
  }
  std::size_t inflight() const override { return inflight_; }
  bool abandoned() const override { return abandoned_; }
  // A refusal is left to the next wait(), which submits what is still queued and handles it.
  void submit_now() override {
    if (!broken_) submit_queued();
  }

  bool wait(std::vector<request*>& out, std::chrono::nanoseconds limit) override {
    if (!refused_.empty()) {
      inflight_ -= refused_.size();
      out.insert(out.end(), refused_.begin(), refused_.end());
      refused_.clear();
      return false;
    }
    bool ran_out = false;
    if (!broken_) {
      const unsigned queued = io_uring_sq_ready(r_);
      const bool timed = limit.count() > 0 && timed_waits();
      const int w = submit(queued, timed ? 0 : 1);
      if (w >= 0 && timed) {
        // Submitted without waiting; now the wait with its limit (no entry needed: the kernel takes the time
        // with the call, and sets a timer only if it has to sleep).
        const int t = posix::sys().uring_wait_for(r_, limit.count());
        if (t == -ETIME) {
          ran_out = true;
        } else if (t < 0 && t != -EINTR) {
          timed_waits_ = false;  // the driver wakes by its copies' callbacks from now on
        }
      }
      if (w >= 0) {
        transient_ = 0;
      } else if (w == -EAGAIN || w == -EBUSY) {
        // No memory for requests right now, or completions to reap first: reaped below, tried again.
        if (++transient_ > 1000) fail_queued(out, std::error_code(-w, std::generic_category()), queued);
      } else if (w != -EINTR) {
        fail_queued(out, std::error_code(-w, std::generic_category()), queued);
      }
    } else if (inflight_ > 0) {
      // Only what the kernel took before the refusal is left: wait for it without submitting (a signal only
      // interrupts the wait).
      const int w = posix::sys().uring_wait(r_);
      if (w == -EINTR) return false;
      if (w < 0) {
        abandoned_ = true;
        for (request* r : active_) {
          r->ec = submit_error_;
          out.push_back(r);
        }
        inflight_ -= active_.size();
        active_.clear();
        return false;
      }
    } else {
      // Nothing left in the kernel, only copies: the ring no longer watches the driver's descriptor, and a
      // landing that left it readable would end every later look at once.
      thread_executor::drain_eventfd(wake_fd_);
    }
    const std::size_t before = out.size();
    reap(&out);
    return ran_out && out.size() == before;
  }
  // Not on a broken ring (its waits take no limit), nor where the kernel cannot take a limit with the wait:
  // liburing would then queue a timeout entry of its own, whose completion may come after the wait and end
  // a later one with ETIME.
  bool timed_waits() const override { return timed_waits_ && !broken_ && (r_->features & IORING_FEAT_EXT_ARG) != 0; }

 private:
  void reap(std::vector<request*>* out) {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(r_, &cqe) == 0) {
      const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(r_, cqe);
      if (tag == k_tag_wake) {
        wake_armed_ = false;
        thread_executor::drain_eventfd(wake_fd_);
        if (out != nullptr && !broken_) arm(wake_fd_, k_tag_wake);
        continue;
      }
      if (tag == k_tag_stop) {
        stop_armed_ = false;  // stays readable from now on: not armed again
        continue;
      }
      if (tag == k_tag_cancel) {
        --pending_control_;
        continue;
      }
      auto* r = reinterpret_cast<request*>(tag);
      // A request reported finished when the ring broke (the kernel had it after all): its memory may serve
      // another request by now, which is not in flight on this ring (nothing is submitted to a broken ring).
      if (r->active_at >= active_.size() || active_[r->active_at] != r) continue;
      const int seen = posix::sys().uring_result(r->write, r->fd, r->io_offset + r->done, r->io_nbytes - r->done, res);
      bool finished = true;
      if (seen == -EINTR || seen == -EAGAIN) {
        finished = false;  // transient: the same remainder again
      } else {
        finished = account(*r, seen);
      }
      if (!finished && !broken_) {
        prep(r);
        continue;
      }
      if (!finished) r->ec = submit_error_;
      deactivate(r);
      --inflight_;
      if (out != nullptr) out->push_back(r);
    }
  }

  // The ring refused requests for good: those queued since the last submission never reached the kernel and
  // fail now; the others are waited for; nothing is submitted on this ring again.
  void fail_queued(std::vector<request*>& out, std::error_code ec, unsigned) {
    broken_ = true;
    submit_error_ = ec;
    for (request* r : unsubmitted_) {
      if (r->active_at >= active_.size() || active_[r->active_at] != r) continue;
      abandoned_ = true;  // the kernel may have taken it before the call failed
      deactivate(r);
      r->ec = ec;
      --inflight_;
      out.push_back(r);
    }
    unsubmitted_.clear();
  }

  // Takes `r` out of active_ in constant time (the last one takes its place).
  void deactivate(request* r) {
    request* last = active_.back();
    active_[r->active_at] = last;
    last->active_at = r->active_at;
    active_.pop_back();
    r->active_at = SIZE_MAX;
  }

  // The slot of `fd` in the ring's table of registered files, entering it at its first request; -1 where it
  // cannot be (no table, the table full, the kernel refused).
  int fixed_file(int fd) {
    if (fd == last_fd_) return last_slot_;
    int slot = -1;
    for (const auto& [f, k] : files_) {
      if (f == fd) slot = static_cast<int>(k);
    }
    if (slot < 0 && h_->files && !h_->free_file_slots.empty()) {
      const unsigned k = h_->free_file_slots.back();
      if (io_uring_register_files_update(r_, k, &fd, 1) == 1) {
        h_->free_file_slots.pop_back();
        files_.emplace_back(fd, k);
        slot = static_cast<int>(k);
      }
    }
    last_fd_ = fd;
    last_slot_ = slot;
    return slot;
  }

  // Hands the `queued` entries to the kernel and waits for `wait_nr` completions; the kernel's answer. The kernel
  // stops at an entry it cannot set up and leaves the rest queued: the requests count as submitted only once a
  // call took every entry.
  int submit(unsigned queued, unsigned wait_nr) {
    const int w = posix::sys().uring_submit_and_wait(r_, wait_nr);
    if (w >= static_cast<int>(queued)) unsubmitted_.clear();
    return w;
  }
  // The queued entries to the kernel without waiting.
  void submit_queued() {
    if (const unsigned queued = io_uring_sq_ready(r_); queued > 0) submit(queued, 0);
  }
  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(r_);
    if (sqe == nullptr) {
      // The submission queue is full (the ring has room for the driver's depth and its polls, so this is rare):
      // hand the queued entries to the kernel now.
      submit_queued();
      sqe = io_uring_get_sqe(r_);
    }
    return sqe;
  }
  void arm(int fd, std::uint64_t tag) {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, tag);
    (tag == k_tag_wake ? wake_armed_ : stop_armed_) = true;
  }
  void prep(request* r) {
    io_uring_sqe* sqe = get_sqe();
    const std::size_t left = r->io_nbytes - r->done;
    const auto n = static_cast<unsigned>(left);
    if (r->fixed >= 0) {
      // Registered staging: the kernel pins nothing for this request.
      if (r->write) {
        io_uring_prep_write_fixed(sqe, r->fd, r->buf + r->done, n, r->io_offset + r->done, r->fixed);
      } else {
        io_uring_prep_read_fixed(sqe, r->fd, r->buf + r->done, n, r->io_offset + r->done, r->fixed);
      }
      if (r->done == 0) g_fixed_requests.fetch_add(1, std::memory_order_relaxed);
    } else if (r->write) {
      io_uring_prep_write(sqe, r->fd, r->buf + r->done, n, r->io_offset + r->done);
    } else {
      io_uring_prep_read(sqe, r->fd, r->buf + r->done, n, r->io_offset + r->done);
    }
    if (const int slot = fixed_file(r->fd); slot >= 0) {
      sqe->fd = slot;
      sqe->flags |= IOSQE_FIXED_FILE;
      if (r->done == 0) g_fixed_file_requests.fetch_add(1, std::memory_order_relaxed);
    }
    // Buffered I/O would run inline in the submitting thread; the kernel's workers copy in parallel instead.
    if (!r->direct) sqe->flags |= IOSQE_ASYNC;
    io_uring_sqe_set_data64(sqe, reinterpret_cast<std::uint64_t>(r));
    unsubmitted_.push_back(r);
  }

  ring_holder* h_;
  io_uring* r_;
  int wake_fd_, stop_fd_;
  std::vector<std::pair<int, unsigned>> files_;  // descriptors this driver entered in the file table, and where
  int last_fd_ = -1, last_slot_ = -1;            // the last descriptor looked up
  std::vector<request*> active_;       // handed to the ring, not yet finished (each knows its place)
  std::vector<request*> unsubmitted_;  // prepared since the last successful submission
  std::vector<request*> refused_;      // submitted after the ring broke: fail at the next wait
  std::size_t inflight_ = 0;
  unsigned pending_control_ = 0;
  unsigned transient_ = 0;
  bool wake_armed_ = false, stop_armed_ = false;
  bool timed_waits_ = true;
  bool broken_ = false;
  bool abandoned_ = false;  // requests reported finished while the kernel may still hold them
  std::error_code submit_error_;
};

#endif

// ---- the plan: ranges to requests, on demand -------------------------------------------------------------------

struct split_state {
  std::size_t parts_left = 0;
  // First byte of the range past end of file: where the size at the start of the batch clipped it, lowered by
  // a part that came back short.
  std::size_t eof_at = SIZE_MAX;
  std::size_t moved = 0;
  // Parts whose bytes are being delivered into the range (copies to GPU memory under way): its one claim is held
  // while any is, and given back (or the range finished) with the last of them.
  unsigned claims = 0;
  std::error_code ec;  // the first part that failed: the range fails once no copy of it is under way
};

class planner_cursor {
 public:
  // `warm`: the files some of whose ranges were in the page cache when the batch began (see driver::plan).
  planner_cursor(detail::batch_state& b, std::vector<std::size_t> order, std::size_t max_request,
                 const std::unordered_map<const open_file*, std::uint64_t>& sizes,
                 const std::unordered_set<const open_file*>& warm, request_pool& pool)
      : b_(b), order_(std::move(order)), max_request_(max_request), sizes_(sizes), warm_(warm), pool_(pool) {}

  bool exhausted() const { return next_ >= order_.size() && pending_.empty(); }

  // A request that joined several ranges failed: each range is read again on its own, so that only a range
  // whose own bytes fail gets the error.
  void retry_separately(const request& failed) {
    for (auto it = failed.parts.rbegin(); it != failed.parts.rend(); ++it) {
      const auto& r = range(it->range);
      request& q = make(*r.file, false, r.offset, it->nbytes);
      q.parts.push_back({it->range, 0, 0, it->nbytes});
      finish_staged(q);
      pending_.push_front(&q);
    }
  }

  // The next request (the pool's), or nullptr when none is left.
  request* next(std::unordered_map<std::size_t, split_state>& splits) {
    if (!plan_ahead(splits)) return nullptr;
    request* r = pending_.front();
    pending_.pop_front();
    return r;
  }
  /// Bytes the kernel will be asked for by the request next() returns; nullopt when none is left.
  std::optional<std::size_t> next_io_bytes(std::unordered_map<std::size_t, split_state>& splits) {
    if (!plan_ahead(splits)) return std::nullopt;
    return pending_.front()->io_nbytes;
  }

 private:
  const detail::batch_range& range(std::size_t i) const { return b_.ranges[i]; }

  // Plans until a request is pending; false when none is left.
  bool plan_ahead(std::unordered_map<std::size_t, split_state>& splits) {
    while (pending_.empty()) {
      if (next_ >= order_.size()) return false;
      plan_some(splits);
    }
    return true;
  }

  // Whether O_DIRECT can use the range's own memory: host memory, the file range and the address aligned.
  bool in_place(std::size_t i, bool write) const {
    const auto& r = range(i);
    const open_file& f = *r.file;
    if (!host_memory(r.memory) || !f.choice.direct) return false;
    // A checksummed read is checked in staging before it may touch the caller's memory.
    if (!write && b_.options.checksum != batch_checksum::none) return false;
    const std::size_t a = f.choice.alignment;
    return r.offset % a == 0 && r.memory.nbytes % a == 0 && reinterpret_cast<std::uintptr_t>(r.memory.data) % a == 0 &&
           (write || r.memory.nbytes > 0);
  }

  // Fetches into the CPU's caches the range this many places ahead of the next one to plan.
  static constexpr std::size_t k_prefetch_ahead = 16;
  void prefetch_ahead() const noexcept {
    if (next_ + k_prefetch_ahead < order_.size()) b_.prefetch(order_[next_ + k_prefetch_ahead]);
  }

  void plan_some(std::unordered_map<std::size_t, split_state>& splits) {
    const bool write = b_.dir == io_direction::write;
    prefetch_ahead();
    const std::size_t first = order_[next_++];
    const auto& r0 = range(first);
    const open_file& f = *r0.file;
    std::size_t len = r0.memory.nbytes;
    if (!write) {
      // Reads past the end return what exists: clip to the size at the start of the batch.
      const std::uint64_t size = sizes_.at(&f);
      len = r0.offset >= size ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(len, size - r0.offset));
      if (len == 0) {
        b_.complete(first, 0, b_.options.exact && r0.memory.nbytes > 0 ? errno_code(ENODATA) : std::error_code{});
        return;
      }
    }
    if (in_place(first, write) && len == r0.memory.nbytes && len % f.choice.alignment == 0) {
      split_in_place(first, len, splits);
      return;
    }
    if (b_.options.checksum != batch_checksum::none && (write || len > max_request_)) {
      whole_staged(first, len, write);
      return;
    }
    if (len > max_request_ || write) {
      split_staged(first, len, write, splits);
      return;
    }
    // Reads through staging: join the ranges of this file that follow within the gap and fit in one request.
    request& q = make(f, false, r0.offset, len);
    q.parts.push_back({first, 0, 0, len});
    while (next_ < order_.size()) {
      const std::size_t i = order_[next_];
      const auto& ri = range(i);
      if (ri.file.get() != &f || in_place(i, false)) break;
      const std::uint64_t end = q.offset + q.nbytes;
      if (ri.offset > end + b_.options.coalesce_gap_bytes) break;
      const std::uint64_t size = sizes_.at(&f);
      std::size_t li = ri.offset >= size ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(ri.memory.nbytes, size - ri.offset));
      if (li == 0 || li != ri.memory.nbytes) break;  // ends at the file's end: on its own
      const std::uint64_t new_end = std::max(end, ri.offset + li);
      if (new_end - q.offset > max_request_) break;
      q.nbytes = static_cast<std::size_t>(new_end - q.offset);
      q.parts.push_back({i, 0, static_cast<std::size_t>(ri.offset - q.offset), li});
      ++next_;
      prefetch_ahead();
    }
    finish_staged(q);
    pending_.push_back(&q);
  }

  request& make(const open_file& f, bool write, std::uint64_t offset, std::size_t nbytes) {
    request& q = pool_.take();
    q.file = &f;
    q.write = write;
    q.offset = offset;
    q.nbytes = nbytes;
    return q;
  }

  // Aligned host memory: pieces at absolute multiples of the request size, straight into the caller's memory.
  void split_in_place(std::size_t i, std::size_t len, std::unordered_map<std::size_t, split_state>& splits) {
    const auto& r = range(i);
    const open_file& f = *r.file;
    const bool write = b_.dir == io_direction::write;
    std::uint64_t pos = r.offset;
    const std::uint64_t end = r.offset + len;
    std::size_t parts = 0;
    // A checksummed range is one request: its checksum covers all of it.
    const bool whole = b_.options.checksum != batch_checksum::none;
    while (pos < end) {
      const std::uint64_t stop =
          whole ? end : std::min<std::uint64_t>(end, align_down(pos, max_request_) + max_request_);
      request& q = make(f, write, pos, static_cast<std::size_t>(stop - pos));
      const std::size_t at = static_cast<std::size_t>(pos - r.offset);
      q.parts.push_back({i, at, 0, q.nbytes});
      q.fd = f.direct_fd.get();
      q.direct = true;
      // A read of data already in the page cache goes through it.
      if (!write && cache_check(f) && prefer_page_cache(f, pos, q.nbytes)) {
        q.fd = f.fd.get();
        q.direct = false;
      }
      q.io_offset = pos;
      q.io_nbytes = q.nbytes;
      q.buf = static_cast<std::byte*>(r.memory.data) + at;
      pending_.push_back(&q);
      ++parts;
      pos = stop;
    }
    mark_split(i, parts, len, splits);
  }

  // A checksummed range that cannot be joined with others: one request for all of it, through one staging slot
  // (a write that is not block-aligned goes whole through the page cache).
  void whole_staged(std::size_t i, std::size_t len, bool write) {
    const auto& r = range(i);
    request& q = make(*r.file, write, r.offset, len);
    q.parts.push_back({i, 0, 0, len});
    finish_staged(q);
    pending_.push_back(&q);
  }

  // A long range, or any write: pieces of at most a request, each through staging. A write's partial blocks
  // are pieces of their own through the buffered descriptor (the kernel merges them with the block's other
  // bytes; the alignment is at least a page, so they never share a page with an O_DIRECT piece).
  void split_staged(std::size_t i, std::size_t len, bool write, std::unordered_map<std::size_t, split_state>& splits) {
    const auto& r = range(i);
    const open_file& f = *r.file;
    const std::uint64_t begin = r.offset, end = r.offset + len;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> cuts;
    const std::size_t a = f.choice.direct ? f.choice.alignment : 1;
    const std::uint64_t mid0 = write ? std::min(align_up(begin, a), end) : begin;
    const std::uint64_t mid1 = write ? std::max<std::uint64_t>(align_down(end, a), mid0) : end;
    if (mid0 > begin) cuts.emplace_back(begin, mid0);
    for (std::uint64_t pos = mid0; pos < mid1;) {
      const std::uint64_t stop = std::min<std::uint64_t>(mid1, align_down(pos, max_request_) + max_request_);
      cuts.emplace_back(pos, stop);
      pos = stop;
    }
    if (end > mid1) cuts.emplace_back(mid1, end);
    for (const auto& [from, to] : cuts) {
      request& q = make(f, write, from, static_cast<std::size_t>(to - from));
      q.parts.push_back({i, static_cast<std::size_t>(from - begin), 0, q.nbytes});
      finish_staged(q);
      pending_.push_back(&q);
    }
    mark_split(i, cuts.size(), len, splits);
  }

  // `len`: the bytes of the range the parts cover (a read clipped at the end of the file covers fewer than its
  // memory holds, and must not count the rest as read).
  void mark_split(std::size_t i, std::size_t parts, std::size_t len,
                  std::unordered_map<std::size_t, split_state>& splits) {
    if (parts <= 1) return;
    for (std::size_t k = pending_.size() - parts; k < pending_.size(); ++k) pending_[k]->split = true;
    splits[i].parts_left = parts;
    splits[i].eof_at = len;
  }

  // Decides descriptor and kernel range of a request that goes through staging.
  void finish_staged(request& q) {
    const open_file& f = *q.file;
    q.staged = true;
    const std::size_t a = f.choice.alignment;
    const bool aligned = q.offset % a == 0 && q.nbytes % a == 0;
    bool direct = f.choice.direct;
    if (q.write) {
      direct = direct && aligned;  // partial blocks go through the page cache (see split_staged)
    } else if (direct && cache_check(f) && prefer_page_cache(f, q.offset, q.nbytes)) {
      direct = false;
    }
    q.direct = direct;
    q.fd = direct ? f.direct_fd.get() : f.fd.get();
    if (direct) {
      q.io_offset = align_down(q.offset, a);
      q.io_nbytes = static_cast<std::size_t>(align_up(q.offset + q.nbytes, a) - q.io_offset);
    } else {
      q.io_offset = q.offset;
      q.io_nbytes = q.nbytes;
    }
  }

  detail::batch_state& b_;
  std::vector<std::size_t> order_;
  std::size_t next_ = 0;
  std::size_t max_request_;
  const std::unordered_map<const open_file*, std::uint64_t>& sizes_;
  const std::unordered_set<const open_file*>& warm_;

  // Whether a read of `f` asks the page cache about each request: only where the batch's sample found some
  // of its ranges cached. A cold file is read with O_DIRECT throughout (coherent with the cache), which saves
  // a mincore per request: a third of the CPU of small random reads.
  bool cache_check(const open_file& f) const { return !f.choice.direct || warm_.count(&f) != 0; }
  request_pool& pool_;
  std::deque<request*> pending_;  // planned, not yet started (the pool's)
};

// ---- the driver ----------------------------------------------------------------------------------------------

class driver {
 public:
  driver(const batch_ptr& b, std::vector<std::size_t> ranges, group_copier* copier, const driver_limits& limits)
      : b_(*b), keep_(b), ranges_(std::move(ranges)), copier_(copier), limits_(limits), staging_(copier) {}

  void run() {
    thread_ = std::this_thread::get_id();
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) throw error(errno_code(errno), "eventfd", "", -1, 0, "batch driver");
    plan();
    std::unique_ptr<executor> ex = make_executor();
    executor_ = ex.get();
    try {
      loop();
    } catch (...) {
      // Requests the kernel (or a worker) still holds read or write staging and the batch's memory: they are
      // asked back and waited for before any of it goes. The ranges are decided by the caller's catch.
      drain_after_failure();
      executor_ = nullptr;
      throw;
    }
    if (!ex->abandoned() && !copies_abandoned_) staging_.mark_reusable();
    executor_ = nullptr;
  }

 private:
  void plan() {
    const bool write = b_.dir == io_direction::write;
    // Sizes at the start: reads past the end are clipped (a file that shrinks later ends them short).
    for (std::size_t i : ranges_) {
      const open_file* f = b_.ranges[i].file.get();
      if (!write && !sizes_.count(f)) {
        try {
          sizes_[f] = f->current_size();
        } catch (const std::system_error&) {
          sizes_[f] = 0;
        }
      }
    }
    // By file and offset, in linear time: a batch of 65,536 random ranges took 5 ms to sort by comparisons (a
    // few percent of its time, with nothing in flight meanwhile), and comparing through the ranges themselves,
    // which lie far apart in memory, took longer still. Ranges at one place keep their order.
    std::vector<key_value> keys(ranges_.size());
    for (std::size_t k = 0; k < ranges_.size(); ++k) keys[k] = {b_.ranges[ranges_[k]].offset, ranges_[k]};
    std::vector<key_value> scratch;
    stable_sort_by_group_and_key(keys, scratch, [&](std::uint64_t i) -> const void* { return b_.ranges[i].file.get(); });
    for (std::size_t k = 0; k < keys.size(); ++k) ranges_[k] = static_cast<std::size_t>(keys[k].value);
    // Depth and bytes in flight: the batch's own depth, else the default depth within the bytes the device's
    // scheduler keeps in flight (never less than the driver's floor).
    const open_file& f0 = *b_.ranges[ranges_.front()].file;
    scheduled_transfer sched(f0.config, f0.st_dev, write ? io_dir::write : io_dir::read, io_client::host, 0);
    const io_shape shape = sched.shape();
    // Staging slots go up to 8 MiB: a request's aligned cover must fit in one.
    max_request_ = std::min({limits_.max_request_bytes, std::max(shape.request_bytes, std::size_t{1} << 20),
                             std::size_t{4} << 20});
    max_request_ = align_down(max_request_, k_block);
    if (b_.options.queue_depth != 0) {
      depth_ = std::min<unsigned>(b_.options.queue_depth, 256);
      budget_ = SIZE_MAX;
    } else {
      depth_ = limits_.default_depth;
      budget_ = std::max(limits_.inflight_bytes, shape.depth * shape.request_bytes);
      share_.attach(f0.st_dev);  // the bytes in flight are the device's, shared with other batches on it
    }
    if (!write) sample_residency();
    cursor_.emplace(b_, ranges_, max_request_, sizes_, warm_, requests_);
  }

  std::unique_ptr<executor> make_executor() {
    const open_file& f0 = *b_.ranges[ranges_.front()].file;
#ifdef GDSKIT_HAVE_URING
    if (f0.choice.engine == engine_kind::io_uring) {
      if (ring_holder* r = driver_ring()) {
        staging_.enter_into(tls_driver_ring);
        return std::make_unique<uring_executor>(r, wake_.get(), b_.stop_fd());
      }
    }
#endif
    // Workers hold pool threads for the driver's life: no more than the batch can have requests (a KV get of a
    // few blocks, a loader's segment), so that batches side by side do not starve each other of the pool.
    std::size_t most_requests = 0;
    for (std::size_t i : ranges_) {
      const std::size_t n = b_.ranges[i].memory.nbytes;
      most_requests += (n + max_request_ - 1) / max_request_ + 1;  // + 1: a cover that straddles a boundary
      if (most_requests >= 64) break;
    }
    // Nor more than the batch's share of the device's depth as it starts (batches side by side divide it; a
    // worker past the share would only hold a pool thread idle).
    const unsigned workers = static_cast<unsigned>(std::clamp<std::size_t>(
        std::min<std::size_t>({share_.depth_share(depth_), f0.config.threads * 8u, most_requests}), 1, 64));
    return std::make_unique<thread_executor>(workers, wake_.get(), b_.stop_fd());
  }

  void loop() {
    std::vector<request*> finished;
    bool cancelled = false;
    for (;;) {
      if (b_.stopping() && !cancelled) {
        // Deadline, cancel or every range decided: nothing new starts; what the kernel holds is asked back.
        executor_->cancel_all();
        cancelled = true;
        share_.wanting(false);  // nothing more starts: what it still has in flight is only waited for
      }
      if (!cancelled) issue();
      collect_landed();  // before flushing: a group seen landed makes room for the next
      flush_copies();
      if (executor_->inflight() == 0 && copies_inflight_ == 0 && (cancelled || nothing_left())) break;
      finished.clear();
      if (executor_->inflight() == 0 && copies_inflight_ > 0 && !copy_landed()) continue;
      if (executor_->inflight() > 0 || copies_inflight_ > 0) {
        if (executor_->wait(finished, copy_look())) ++looks_;
      }
      for (const request* r : finished) {
        for (const auto& p : r->parts) b_.prefetch_result(p.range);
      }
      for (request* r : finished) on_finished(*r);
      collect_landed();
    }
    if (copier_ != nullptr) copier_->drain();
  }

  // After loop() failed: cancels what is in flight and waits for it (best effort: a failure here leaves the
  // rest to the kernel, and the staging is then never reused).
  void drain_after_failure() noexcept {
    try {
      executor_->cancel_all();
      std::vector<request*> finished;
      while (executor_->inflight() > 0) {
        finished.clear();
        executor_->wait(finished);
        for (request* r : finished) share_.remove(r->io_nbytes);
      }
      if (copier_ != nullptr) copier_->drain();
    } catch (...) {
    }
  }

  // Only copy groups are left: waits up to k_copy_check_ms for one to land (true: the executor's wait returns at
  // once), unless the copier shows one has landed already. Otherwise asks the copier whether they still can, and
  // gives them up when the device's context broke (their callbacks would never run and the batch would never
  // end); false in those cases, to look again.
  static constexpr int k_copy_check_ms = 200;
  bool copy_landed() {
    copier_->poll();
    {
      std::lock_guard lock(done_mutex_);
      if (!done_groups_.empty()) return false;  // ended just now, on this thread: the loop takes them
    }
    copier_->arm();
    pollfd p{wake_.get(), POLLIN, 0};
    if (::poll(&p, 1, k_copy_check_ms) != 0) return true;
    if (const std::error_code ec = copier_->failure()) {
      abandon_copies(ec);
      take_copy_completions();
    }
    return false;
  }

  // Before the driver sleeps on requests in flight with copy groups in flight too. A group that lands while it
  // sleeps would wait for the next completion to be seen (the driver reads the copier's landing word on every
  // wake): one read's time on a device that completes reads in bunches (a virtual disk: 2 MiB ranges into GPU
  // memory took twice the ring's latency). The copier can be asked to wake the driver when they land (arm():
  // a host function, some microseconds of CPU on two threads, and a lock the copier also takes), but a driver
  // busy with completions that armed on every sleep made itself busier still (4 KiB batches into GPU memory
  // at 0.5-0.9 of the ring from one run to the next). So the driver sleeps at most 50 us, then 250 us, and
  // looks at the word when the time runs out; a completion ends the sleep as before, and a busy driver, whose
  // completions are already waiting, never waits out the time. Only groups still in flight after both arm,
  // as every sleep does once the batch stops (only what is in flight is waited for, and a claimed range is
  // out of the deadline's reach) or where the executor cannot time its waits. Returns the limit for the
  // sleep (zero: none).
  static constexpr std::chrono::nanoseconds k_copy_looks[] = {std::chrono::microseconds(50),
                                                              std::chrono::microseconds(250)};
  std::chrono::nanoseconds copy_look() {
    if (copier_ == nullptr || copies_inflight_ == 0) return {};
    if (!b_.stopping() && looks_ < std::size(k_copy_looks) && executor_->timed_waits()) return k_copy_looks[looks_];
    copier_->arm();
    return {};
  }

  // Gives up every copy group in flight with `ec`: the ranges they were to fill whole fail now (their callback
  // will never run, and one that did run after all finds nothing left to decide), the rest as their groups'
  // outcome. Their staging is never reused (staging::mark_reusable is not called).
  void abandon_copies(std::error_code ec) {
    for (const auto& [token, requests] : groups_) {
      const auto lost = take_landings(token);
      if (!lost) continue;  // landed: its outcome is queued already
      for (const landing& l : *lost) b_.finish(l.range, 0, ec);
      std::lock_guard lock(done_mutex_);
      done_groups_.emplace_back(token, ec);
    }
    copies_abandoned_ = true;
    log_warning(fmt::format("batch driver: copy groups given up: {}", ec.message()));
  }

  bool nothing_left() const { return cursor_->exhausted() && ready_writes_.empty() && staged_writes_count() == 0; }
  std::size_t staged_writes_count() const {
    std::size_t n = 0;
    for (const auto& w : staged_writes_) n += w ? 1 : 0;
    return n;
  }

  // Starts requests while depth and bytes allow.
  void issue() {
    share_.wanting(!nothing_left());  // work may have come back (a joined read retried in parts)
    // Writes whose bytes came from GPU memory go first: their staging is already taken.
    while (!ready_writes_.empty() && room(ready_writes_.front()->io_nbytes)) {
      request* r = ready_writes_.front();
      ready_writes_.pop_front();
      start(r);
    }
    // Each request is weighed at its own size: a batch of small requests fills its share of the device's
    // bytes with as many of them as fit, not with as many as the largest request would allow.
    for (;;) {
      const std::optional<std::size_t> nbytes = cursor_->next_io_bytes(splits_);
      if (!nbytes || !room(*nbytes)) break;
      request* r = cursor_->next(splits_);
      if (!prepare(*r)) {
        release(*r);  // decided meanwhile, or failed
        continue;
      }
      if (r->write && r->to_device) {
        // GPU memory to write: its bytes come to staging first (one group of copies per round).
        stage_from_device(*r);
        continue;
      }
      start(r);
    }
    share_.wanting(!nothing_left());
  }

  bool room(std::size_t nbytes) const {
    if (executor_->inflight() + staged_writes_count() >= depth_) return false;
    // Reads whose bytes wait in staging for their copy hold staging: a bounded number of them.
    if (reads_awaiting_copy_ >= k_copy_hold_per_depth * depth_) return false;
    return share_.fits(nbytes, budget_, depth_);
  }

  // Gives a request its staging slot (and, for host-memory writes, its bytes). False when none of its ranges
  // is still open, or on failure (the ranges then have their error): the caller then releases it.
  bool prepare(request& r) {
    bool any_open = false;
    for (const auto& p : r.parts) any_open = any_open || !b_.decided(p.range);
    if (!any_open) return false;
    b_.requests.fetch_add(1, std::memory_order_relaxed);
    if (!r.direct) b_.buffered.fetch_add(1, std::memory_order_relaxed);
    const auto& mem0 = b_.ranges[r.parts.front().range].memory;
    r.to_device = !host_memory(mem0);
    for (const auto& p : r.parts) {
      if (p.range_off == 0) (r.to_device ? b_.routed_staged : b_.routed_host).fetch_add(1, std::memory_order_relaxed);
    }
    if (!r.staged) {
      // In place: a checksummed write's bytes are the caller's (one request for the whole range), read here
      // under the range's claim: a range the deadline decided may already be memory the caller freed.
      if (r.write && checksummed()) {
        const delivery& p = r.parts.front();
        if (!b_.claim(p.range)) return false;
        r.crc = crc32c(r.buf, r.nbytes);
        b_.unclaim(p.range);
      }
      return true;
    }
    r.buf = staging_.take(r.io_nbytes);
    r.fixed = staging_.fixed_index(r.buf);
    if (r.buf == nullptr) {
      fail_parts(r, errno_code(ENOMEM));
      return false;
    }
    if (r.write && !r.to_device) {
      // Host memory to write (one range per write request): copied into the slot under the range's claim; a
      // range decided meanwhile is not written.
      const delivery& p = r.parts.front();
      if (!b_.claim(p.range)) return false;
      const auto& mem = b_.ranges[p.range].memory;
      std::byte* at = r.buf + (r.offset - r.io_offset) + p.req_off;
      std::memcpy(at, static_cast<const std::byte*>(mem.data) + p.range_off, p.nbytes);
      if (checksummed()) r.crc = crc32c(at, p.nbytes);
      b_.unclaim(p.range);
    }
    return true;
  }

  bool checksummed() const { return b_.options.checksum != batch_checksum::none; }

  void start(request* r) {
    if (r->issued == std::chrono::steady_clock::time_point{}) r->issued = std::chrono::steady_clock::now();
    share_.add(r->io_nbytes);
    executor_->submit(r);
  }

  void stage_from_device(request& r) {
    for (const auto& p : r.parts) {
      const auto& mem = b_.ranges[p.range].memory;
      copier_->add(false, r.buf + (r.offset - r.io_offset) + p.req_off,
                   reinterpret_cast<std::uintptr_t>(mem.data) + p.range_off, p.nbytes);
    }
    group_.push_back(&r);
    for (auto& w : staged_writes_) {
      if (!w) {
        w = &r;
        return;
      }
    }
    staged_writes_.push_back(&r);
  }

  void on_finished(request& r) {
    share_.remove(r.io_nbytes);
    if (r.ec && !r.write && r.parts.size() > 1 && !b_.stopping()) {
      cursor_->retry_separately(r);
      release(r);
      return;
    }
    if (r.ec) {
      fail_parts(r, r.ec);
      release(r);
      return;
    }
    if (r.write) {
      for (const auto& p : r.parts) part_done(p, p.nbytes, r, false, r.crc);
      release(r);
      return;
    }
    const std::size_t got = logical_got(r);
    if (!r.staged) {
      // The kernel read straight into the range's memory.
      for (const auto& p : r.parts) part_done(p, std::min(p.nbytes, got > p.req_off ? got - p.req_off : 0), r);
      release(r);
      return;
    }
    const std::size_t head = static_cast<std::size_t>(r.offset - r.io_offset);
    bool queued = false;
    r.claimed.assign(r.parts.size(), copy_state::none);
    if (checksummed()) r.crcs.assign(r.parts.size(), 0);
    for (std::size_t k = 0; k < r.parts.size(); ++k) {
      const delivery& p = r.parts[k];
      const std::size_t n = std::min(p.nbytes, got > p.req_off ? got - p.req_off : 0);
      if (checksummed() && !verified(r, k, n)) continue;
      if (n == 0) {
        part_done(p, 0, r);
        continue;
      }
      if (r.to_device) {
        // Claimed, and its copy queued, when its group goes out (flush_copies): until then the deadline may
        // still decide the range, which a held group would otherwise keep from it.
        r.claimed[k] = copy_state::awaiting_group;
        queued = true;
        continue;
      }
      if (!claim_part(p.range)) continue;
      const auto& mem = b_.ranges[p.range].memory;
      std::memcpy(static_cast<std::byte*>(mem.data) + p.range_off, r.buf + head + p.req_off, n);
      part_done(p, n, r, true, r.crcs.empty() ? 0 : r.crcs[k]);
    }
    if (queued) {
      group_.push_back(&r);
      group_bytes_ += r.nbytes;
      ++reads_awaiting_copy_;
      return;  // released once its copies have landed
    }
    release(r);
  }

  // Checks part k of a checksummed read in staging: true when its `n` bytes are the whole range and match the
  // range's checksum; otherwise the range completes here (ENODATA short, EBADMSG different) and nothing of it is
  // delivered.
  bool verified(request& r, std::size_t k, std::size_t n) {
    const delivery& p = r.parts[k];
    const std::size_t head = static_cast<std::size_t>(r.offset - r.io_offset);
    const std::uint32_t c = crc32c(r.buf + head + p.req_off, n);
    r.crcs[k] = c;
    const double latency = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.issued).count();
    if (n < b_.ranges[p.range].memory.nbytes) {
      b_.complete(p.range, n, errno_code(ENODATA), latency, c);
      return false;
    }
    if (c != b_.ranges[p.range].crc32c) {
      b_.checksum_mismatches.fetch_add(1, std::memory_order_relaxed);
      b_.complete(p.range, 0, errno_code(EBADMSG), latency, c);
      return false;
    }
    return true;
  }

  // Takes range `i`'s claim for the delivery of one part. The parts of a split range share the claim: a part
  // whose copy starts while another's is under way joins it instead of being refused.
  bool claim_part(std::size_t i) {
    const auto it = splits_.find(i);
    if (it != splits_.end() && it->second.claims > 0) {
      ++it->second.claims;
      return true;
    }
    if (!b_.claim(i)) return false;
    if (it != splits_.end()) it->second.claims = 1;
    return true;
  }

  // One part of a range is over with `n` of its bytes moved; `claimed` when it was delivered under claim_part();
  // `crc` the range's checksum (checksummed batches, whose ranges are one part each).
  void part_done(const delivery& p, std::size_t n, const request& r, bool claimed = false, std::uint32_t crc = 0) {
    const double latency = r.issued == std::chrono::steady_clock::time_point{} ? 0.0
        : std::chrono::duration<double>(std::chrono::steady_clock::now() - r.issued).count();
    const std::size_t want = p.nbytes;
    auto it = splits_.find(p.range);
    if (it == splits_.end()) {
      // The whole range in one part.
      const auto& mem = b_.ranges[p.range].memory;
      const std::size_t moved = p.range_off + n;
      std::error_code ec;
      if (b_.dir == io_direction::read && moved < mem.nbytes && b_.options.exact) ec = errno_code(ENODATA);
      (void)want;
      if (claimed) {
        b_.finish(p.range, moved, ec, latency, crc);
      } else {
        b_.complete(p.range, moved, ec, latency, crc);
      }
      return;
    }
    split_state& s = it->second;
    s.moved += n;
    if (n < want) s.eof_at = std::min(s.eof_at, p.range_off + n);
    if (claimed) --s.claims;
    if (--s.parts_left > 0) {
      if (claimed && s.claims == 0) {
        if (s.ec) {
          const std::error_code failed = s.ec;
          splits_.erase(it);
          b_.finish(p.range, 0, failed, latency);
        } else {
          b_.unclaim(p.range);
        }
      }
      return;
    }
    const auto& mem = b_.ranges[p.range].memory;
    std::size_t moved = std::min(s.eof_at, mem.nbytes);
    std::error_code ec = s.ec;
    if (ec) {
      moved = 0;
    } else if (b_.dir == io_direction::read && moved < mem.nbytes && b_.options.exact) {
      ec = errno_code(ENODATA);
    }
    splits_.erase(it);
    if (claimed) {
      b_.finish(p.range, moved, ec, latency);
    } else {
      b_.complete(p.range, moved, ec, latency);
    }
  }

  // One part of a range failed with `ec`; `claimed` as for part_done. A split range whose other parts are being
  // copied into its memory fails once those copies have landed, never while they may still land.
  void part_failed(const delivery& p, std::error_code ec, bool claimed) {
    auto it = splits_.find(p.range);
    if (it != splits_.end()) {
      split_state& s = it->second;
      if (!s.ec) s.ec = ec;
      if (claimed) --s.claims;
      --s.parts_left;
      if (s.claims > 0) return;
      splits_.erase(it);
    }
    if (claimed) {
      b_.finish(p.range, 0, ec);
    } else {
      b_.complete(p.range, 0, ec);
    }
  }

  void fail_parts(request& r, std::error_code ec) {
    for (const auto& p : r.parts) part_failed(p, ec, false);
  }

  void release(request& r) {
    if (r.staged && r.buf != nullptr) staging_.give(r.buf, r.io_nbytes);
    requests_.give(r);
  }

  // A read part that is its range's only part, delivered by a group of copies: the group's end (the copier's
  // poll on this thread, or its callback on another) gives the range its outcome itself.
  struct landing {
    std::size_t range;
    std::size_t moved;
    std::error_code ec;
    std::uint32_t crc;
    std::chrono::steady_clock::time_point issued;
  };

  // Copy groups in flight at most. Holding the next group while others are in flight lets it grow by whatever
  // finishes meanwhile: each launch (a copy kernel or the engines' copies, and the landing word after them)
  // costs the driver some microseconds, and a copier whose groups end by host functions alone (no landing
  // word) runs those one after another at some tens of microseconds each, which one group per completion round
  // would queue behind each other at small sizes. Each range waits for at most one round; room() bounds how
  // many reads wait so.
  static constexpr std::size_t k_copy_groups_inflight = 2;
  // A read group of fewer bytes than this waits while one is in flight, as long as reads that may join it are
  // in flight too. Cold 64 KiB reads complete one or two per wake, and with a second group free to go nearly
  // each had a launch of its own: waiting spent 15% less CPU per GiB at the same rate, and 4 KiB reads alike. A
  // larger group goes beside the one in flight, so that reads that come faster than copies land (the page
  // cache, 2 MiB ranges) keep the copy stream fed, and so does a group nothing more can join (the batch's last
  // reads, or reads held back by room()): waiting would only add a copy round to its ranges' latency. Writes
  // never wait so: a write cannot go before its bytes have come out of GPU memory.
  static constexpr std::size_t k_copy_group_alone_bytes = std::size_t{1} << 20;
  bool hold_group() const {
    if (b_.stopping()) return false;
    if (copies_inflight_ >= k_copy_groups_inflight) return true;
    return copies_inflight_ > 0 && b_.dir == io_direction::read && group_bytes_ < k_copy_group_alone_bytes &&
           executor_->inflight() > 0;
  }
  static constexpr std::size_t k_copy_hold_per_depth = 4;

  // Claims the waiting parts of the reads in group_ and queues their copies; reads none of whose parts could
  // be claimed (the deadline decided them meanwhile) leave the group and give their staging back.
  void claim_group() {
    std::vector<request*> kept;
    kept.reserve(group_.size());
    for (request* r : group_) {
      if (r->write) {
        kept.push_back(r);
        continue;
      }
      const std::size_t head = static_cast<std::size_t>(r->offset - r->io_offset);
      const std::size_t got = logical_got(*r);
      bool any = false;
      for (std::size_t k = 0; k < r->parts.size(); ++k) {
        if (r->claimed[k] != copy_state::awaiting_group) continue;
        const delivery& p = r->parts[k];
        if (!claim_part(p.range)) {
          r->claimed[k] = copy_state::none;
          continue;
        }
        const std::size_t n = std::min(p.nbytes, got > p.req_off ? got - p.req_off : 0);
        const auto& mem = b_.ranges[p.range].memory;
        copier_->add(true, r->buf + head + p.req_off, reinterpret_cast<std::uintptr_t>(mem.data) + p.range_off, n);
        r->claimed[k] = copy_state::queued;
        any = true;
      }
      if (any) {
        kept.push_back(r);
      } else {
        --reads_awaiting_copy_;
        release(*r);
      }
    }
    group_.swap(kept);
  }

  void flush_copies() {
    if (group_.empty()) return;
    if (hold_group()) return;
    // The group's launches take tens of microseconds of this thread: the reads issued on this wake go to the
    // kernel first instead of waiting in the ring's queue until the driver sleeps.
    executor_->submit_now();
    claim_group();
    group_bytes_ = 0;  // the group goes now, or nothing of it is left
    if (group_.empty()) return;
    const std::uint64_t token = next_token_++;
    // The ranges a group fills whole end the moment its copies have landed, not when this thread next looks:
    // it may be held up by other requests (a slow completion, a request it runs itself), and a claimed range
    // is out of reach of the batch's deadline, so the batch would end that much after it.
    std::vector<landing> landings;
    for (request* r : group_) {
      if (r->write) continue;
      const std::size_t got = logical_got(*r);
      for (std::size_t k = 0; k < r->parts.size(); ++k) {
        const delivery& p = r->parts[k];
        if (r->claimed[k] != copy_state::queued || splits_.count(p.range) != 0) continue;
        const std::size_t n = std::min(p.nbytes, got > p.req_off ? got - p.req_off : 0);
        const std::size_t moved = p.range_off + n;
        std::error_code ec;
        if (moved < b_.ranges[p.range].memory.nbytes && b_.options.exact) ec = errno_code(ENODATA);
        landings.push_back({p.range, moved, ec, r->crcs.empty() ? 0 : r->crcs[k], r->issued});
        r->claimed[k] = copy_state::decided_on_landing;
      }
    }
    groups_.emplace(token, std::move(group_));
    group_.clear();
    ++copies_inflight_;
    {
      std::lock_guard lock(done_mutex_);
      landings_.emplace(token, std::move(landings));
    }
    auto* self = this;
    copier_->flush(token, [self](std::uint64_t t, std::error_code ec) { self->copy_done(t, ec); });
  }

  // The ranges group `token` fills whole, taken by whichever comes first of its callback and abandon_copies;
  // nothing for the other.
  std::optional<std::vector<landing>> take_landings(std::uint64_t token) {
    std::lock_guard lock(done_mutex_);
    auto it = landings_.find(token);
    if (it == landings_.end()) return std::nullopt;
    std::vector<landing> out = std::move(it->second);
    landings_.erase(it);
    return out;
  }

  // From the copier's thread: decide the ranges the group filled whole, queue the group's outcome (its staging
  // and the rest of its parts) and wake the driver. Nothing, for a group given up meanwhile (abandon_copies).
  void copy_done(std::uint64_t token, std::error_code ec) {
    const auto landings = take_landings(token);
    if (!landings) return;
    for (const landing& l : *landings) b_.prefetch_result(l.range);
    const auto now = std::chrono::steady_clock::now();
    for (const landing& l : *landings) {
      const double latency = l.issued == std::chrono::steady_clock::time_point{}
          ? 0.0 : std::chrono::duration<double>(now - l.issued).count();
      if (ec) {
        b_.finish(l.range, 0, ec, latency);
      } else {
        b_.finish(l.range, l.moved, l.ec, latency, l.crc);
      }
    }
    {
      std::lock_guard lock(done_mutex_);
      done_groups_.emplace_back(token, ec);
    }
    if (std::this_thread::get_id() == thread_) return;  // ended by the driver's own poll: it looks next
    const std::uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }

  // Ends the copy groups the copier can see have landed (on this thread, with no waiting), then takes the
  // outcomes of every group ended so far.
  void collect_landed() {
    if (copier_ != nullptr) copier_->poll();
    take_copy_completions();
  }

  void take_copy_completions() {
    std::vector<std::pair<std::uint64_t, std::error_code>> done;
    {
      std::lock_guard lock(done_mutex_);
      done.swap(done_groups_);
    }
    for (const auto& [token, ec] : done) {
      auto it = groups_.find(token);
      if (it == groups_.end()) continue;
      std::vector<request*> requests = std::move(it->second);
      groups_.erase(it);
      --copies_inflight_;
      looks_ = 0;
      for (request* r : requests) {
        if (r->write) {
          // Bytes from GPU memory are in staging: the write can go (unless the batch stopped meanwhile).
          for (auto& w : staged_writes_) {
            if (w == r) w = nullptr;
          }
          if (ec) {
            fail_parts(*r, ec);
            release(*r);
          } else if (b_.stopping()) {
            release(*r);
          } else {
            if (checksummed()) r->crc = crc32c(r->buf + (r->offset - r->io_offset), r->nbytes);
            ready_writes_.push_back(r);
          }
          continue;
        }
        // Reads: every claimed part of the request has landed (or failed) in GPU memory.
        --reads_awaiting_copy_;
        const std::size_t got = logical_got(*r);
        for (std::size_t k = 0; k < r->parts.size(); ++k) {
          const delivery& p = r->parts[k];
          if (r->claimed[k] != copy_state::queued) continue;  // not claimed, or decided when its copies landed
          const std::size_t n = std::min(p.nbytes, got > p.req_off ? got - p.req_off : 0);
          if (ec) {
            part_failed(p, ec, true);
          } else {
            part_done(p, n, *r, true, r->crcs.empty() ? 0 : r->crcs[k]);
          }
        }
        release(*r);
      }
    }
  }

  detail::batch_state& b_;
  batch_ptr keep_;
  std::vector<std::size_t> ranges_;
  group_copier* copier_;
  driver_limits limits_;
  staging staging_;
  std::size_t looks_ = 0;  // sleeps whose time ran out since a copy group last landed
  posix::unique_fd wake_;
  std::thread::id thread_;  // the thread run() runs on
  std::unordered_map<const open_file*, std::uint64_t> sizes_;
  std::unordered_set<const open_file*> warm_;

  // Asks the page cache about up to 16 ranges of each file, spread over the batch (ranges_ is sorted by file
  // and offset): a file with any of them cached is checked request by request, the others are read directly.
  void sample_residency() {
    constexpr std::size_t k_samples = 16;
    std::size_t first = 0;
    while (first < ranges_.size()) {
      const open_file* f = b_.ranges[ranges_[first]].file.get();
      std::size_t last = first;
      while (last < ranges_.size() && b_.ranges[ranges_[last]].file.get() == f) ++last;
      if (f->choice.direct && f->config.direct != direct_mode::on) {
        const std::size_t n = last - first;
        const std::size_t step = std::max<std::size_t>(1, n / k_samples);
        for (std::size_t k = first; k < last; k += step) {
          const auto& r = b_.ranges[ranges_[k]];
          if (resident_fraction(*f, r.offset, std::max<std::size_t>(r.memory.nbytes, 1)) > 0) {
            warm_.insert(f);
            break;
          }
        }
      }
      first = last;
    }
  }
  request_pool requests_;  // before cursor_, which plans into it
  std::optional<planner_cursor> cursor_;
  executor* executor_ = nullptr;
  std::size_t max_request_ = 0;
  unsigned depth_ = 64;
  std::size_t budget_ = 0;
  device_share share_;  // bytes of requests in flight, this driver's and its device's
  std::unordered_map<std::size_t, split_state> splits_;
  std::deque<request*> ready_writes_;
  std::vector<request*> staged_writes_;  // GPU-memory writes whose copies into staging are in flight
  std::vector<request*> group_;
  std::size_t group_bytes_ = 0;  // the bytes of the reads in group_ (their requests')
  std::map<std::uint64_t, std::vector<request*>> groups_;
  std::uint64_t next_token_ = 1;
  std::size_t copies_inflight_ = 0;
  std::size_t reads_awaiting_copy_ = 0;  // read requests in group_ or in a group in flight
  std::mutex done_mutex_;
  std::vector<std::pair<std::uint64_t, std::error_code>> done_groups_;
  std::unordered_map<std::uint64_t, std::vector<landing>> landings_;  // groups in flight (under done_mutex_)
  bool copies_abandoned_ = false;
};

// Runs `body` on the shared pool under a hold of the batch (taken now, so the batch cannot be released before
// the job has started and looked at it). The job holds its pool thread until it ends (a driver for its batch's
// life): the pool keeps a thread for every such job, so that batches side by side run side by side.
template <class Body>
void launch(const batch_ptr& b, Body body) {
  auto thread = std::make_shared<pool_hold>(1);
  b->hold();
  try {
    shared_pool(1).submit([b, thread, body = std::move(body)]() mutable {
      try {
        body();
      } catch (const std::exception& e) {
        log_warning(fmt::format("batch: {}", e.what()));
      }
      b->release_hold();
      *thread = pool_hold();  // the thread is free again
    });
  } catch (...) {
    b->release_hold();
    throw;
  }
}

// Ranges through the single-range routes, `jobs` at a time.
void run_singles(const transfer_core& core, const batch_ptr& b, std::vector<std::size_t> ranges, unsigned jobs) {
  auto list = std::make_shared<std::vector<std::size_t>>(std::move(ranges));
  auto next = std::make_shared<std::atomic<std::size_t>>(0);
  jobs = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(list->size())));
  for (unsigned j = 0; j < jobs; ++j) {
    launch(b, [&core, b, list, next] {
      for (;;) {
        const std::size_t k = next->fetch_add(1);
        if (k >= list->size() || b->stopping()) return;
        const std::size_t i = (*list)[k];
        if (b->decided(i)) continue;
        const detail::batch_range& r = b->ranges[i];
        const std::size_t n = r.memory.nbytes;
        const bool write = b->dir == io_direction::write;
        std::size_t got = 0;
        std::error_code ec;
        const auto t0 = std::chrono::steady_clock::now();
        try {
          got = core.move(*r.file, write, r.memory, n, r.offset);
          if (!write && got < n && b->options.exact) ec = errno_code(ENODATA);
        } catch (const std::system_error& e) {
          ec = e.code();
        } catch (const std::bad_alloc&) {
          ec = errno_code(ENOMEM);
        }
        (host_memory(r.memory) ? b->routed_host : (r.file->route(r.memory) == data_path::staged
                                                       ? b->routed_staged
                                                       : b->routed_gds))
            .fetch_add(1, std::memory_order_relaxed);
        b->requests.fetch_add(1, std::memory_order_relaxed);
        b->complete(i, got, ec, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    });
  }
}

// GPU memory the planner sends through true GDS: cuFile's batch API where the library has it, else the
// single-range route one range after another.
void run_cufile(const transfer_core& core, const batch_ptr& b, std::vector<std::size_t> ranges) {
  launch(b, [&core, b, ranges = std::move(ranges)]() mutable {
    const bool write = b->dir == io_direction::write;
    std::vector<cufile_entry> entries;
    entries.reserve(ranges.size());
    for (std::size_t i : ranges) {
      const detail::batch_range& r = b->ranges[i];
      entries.push_back({r.file.get(), write, r.memory, r.offset, r.memory.nbytes});
    }
    const auto t0 = std::chrono::steady_clock::now();
    bool ran = false;
    try {
      ran = core.gpu().cufile_batch(
          entries, [&] { return b->stopping(); },
          [&](std::size_t k, std::size_t bytes, std::error_code ec) {
            const std::size_t i = ranges[k];
            if (!ec && !write && bytes < b->ranges[i].memory.nbytes && b->options.exact) ec = errno_code(ENODATA);
            b->routed_gds.fetch_add(1, std::memory_order_relaxed);
            b->requests.fetch_add(1, std::memory_order_relaxed);
            b->complete(i, bytes, ec, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          });
    } catch (const std::system_error& e) {
      for (std::size_t i : ranges) b->complete(i, 0, e.code());
      return;
    }
    if (!ran) run_singles(core, b, std::move(ranges), 4);
  });
}

void run_driver(const transfer_core& core, const batch_ptr& b, std::vector<std::size_t> ranges, int device,
                const driver_limits& limits) {
  launch(b, [&core, b, ranges = std::move(ranges), device, limits]() mutable {
    std::unique_ptr<group_copier> copier;
    const std::vector<std::size_t> mine = ranges;
    try {
      if (device >= 0) copier = core.gpu().make_group_copier(device);
      driver d(b, std::move(ranges), copier.get(), limits);
      d.run();
    } catch (const std::system_error& e) {
      // The driver could not start or go on: its open ranges fail with the reason.
      for (std::size_t i : mine) b->complete(i, 0, e.code());
      log_warning(fmt::format("batch driver: {}", e.what()));
    } catch (const std::bad_alloc&) {
      for (std::size_t i : mine) b->complete(i, 0, errno_code(ENOMEM));
      log_warning("batch driver: out of memory");
    }
  });
}

}  // namespace

void run_batch(const transfer_core& core, const batch_ptr& b, const driver_limits& limits) {
  std::vector<std::size_t> singles, gds;
  std::map<int, std::vector<std::size_t>> drive;  // -1: host memory; else the GPU
  const bool write = b->dir == io_direction::write;
  // Checksums are computed where the bytes sit in host memory: only the driver's host and staged routes have
  // them there, so a checksummed range never goes to the single-range path or to cuFile.
  const bool checked = b->options.checksum != batch_checksum::none;
  for (std::size_t i = 0; i < b->ranges.size(); ++i) {
    const detail::batch_range& r = b->ranges[i];
    if (r.memory.nbytes == 0) {
      b->complete(i, 0, {});
      continue;
    }
    if (checked) {
      drive[host_memory(r.memory) ? -1 : (r.memory.device < 0 ? 0 : r.memory.device)].push_back(i);
      continue;
    }
    if (r.memory.nbytes >= limits.stream_bytes) {
      singles.push_back(i);
      continue;
    }
    if (host_memory(r.memory)) {
      drive[-1].push_back(i);
      continue;
    }
    const data_path p = r.file->route(r.memory);
    if (p == data_path::gds) {
      gds.push_back(i);
    } else if (p == data_path::compat) {
      singles.push_back(i);  // cuFile's compat mode has no batch support
    } else {
      drive[r.memory.device < 0 ? 0 : r.memory.device].push_back(i);
    }
  }
  (void)write;
  for (auto& [device, ranges] : drive) run_driver(core, b, std::move(ranges), device, limits);
  // Each single-range transfer is parallel itself: a few at once keep the device busy; the batch's depth wins.
  if (!singles.empty()) run_singles(core, b, std::move(singles), b->options.queue_depth != 0 ? b->options.queue_depth : 4);
  if (!gds.empty()) run_cufile(core, b, std::move(gds));
  b->release_hold();  // every job above holds the batch itself
}

host_staging_counters host_staging() {
  host_staging_counters c = host_chunks::instance().counters();
  c.fixed_requests = g_fixed_requests.load(std::memory_order_relaxed);
  c.fixed_file_requests = g_fixed_file_requests.load(std::memory_order_relaxed);
#ifdef GDSKIT_HAVE_URING
  c.chunks_entered = g_chunks_entered.load(std::memory_order_relaxed);
  c.entries_reused = g_entries_reused.load(std::memory_order_relaxed);
  c.registration_limit = registration_cap();
#endif
  return c;
}

void trim_host_staging() noexcept { host_chunks::instance().trim(); }

}  // namespace gdskit::engine
