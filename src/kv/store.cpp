// block_store: opening (options, volumes, recovery), gets and puts as batches of the transfer core with every
// block checksummed on its way (CRC32C), asynchronous operations and their futures, statistics and close.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>

#include <fmt/format.h>

#include "common/idle_pool.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/checksum.hpp"
#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"
#include "kv/format.hpp"
#include "kv/shard.hpp"
#include "kv/volume.hpp"

namespace gdskit::kv {

using detail::clock;

namespace {

// The most bytes the transfer core checks as one range (batch_options::checksum moves a range whole through
// one staging slot of at most 16 MiB). A block is read as one checked range when it fits; larger blocks are
// written in pieces of this size and read through the store's own memory.
constexpr std::size_t k_piece_bytes = std::size_t{8} << 20;

struct aligned_free {
  void operator()(void* p) const noexcept { std::free(p); }
};

// `n` bytes of host memory aligned for O_DIRECT (4 KiB), zeroed unless `zeroed` is false, shared so that a
// request past its deadline can keep it.
std::shared_ptr<std::uint8_t[]> aligned_pages(std::size_t n, bool zeroed = true) {
  const std::size_t bytes = detail::round_up(std::max<std::size_t>(n, 1), detail::page_bytes);
  void* p = std::aligned_alloc(detail::page_bytes, bytes);
  if (p == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(p, 0, bytes);
  return {static_cast<std::uint8_t*>(p), aligned_free{}};
}

// Blocks over k_piece_bytes are read through the store's memory: this many bytes of them in flight per get (at
// least two blocks, so that one is checked and copied while the next is read; one where a block is larger than
// k_large_alone_bytes), and this many kept idle between gets (new memory costs its page faults).
constexpr std::size_t k_large_get_bytes = std::size_t{64} << 20;
constexpr std::size_t k_large_alone_bytes = std::size_t{128} << 20;
constexpr std::size_t k_large_idle_bytes = std::size_t{256} << 20;

}  // namespace

namespace detail {

/// A key of a get that the index holds, with its claim on the slot.
struct get_item {
  std::size_t i = 0;  // position in the call
  shard* sh = nullptr;
  read_ticket t;
};

/// A get moved by one batch of the transfer core, until its outcome is made.
struct get_job {
  block_store::impl* store = nullptr;
  std::vector<key> keys;
  std::vector<get_item> items;  // in the order of the batch's ranges
  op_result res;
  clock::time_point t0;
  clock::time_point submitted;  // when its batch was submitted
};

/// A key of a put that has a slot, and what became of it.
struct put_item {
  std::size_t i = 0;
  shard* sh = nullptr;
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
  std::size_t first_range = 0, ranges = 0;  // its pieces among the data batch's ranges
  std::uint32_t crc = 0;
  std::error_code ec;
  bool given_up = false;  // its slot is handed back (its error recorded)
};

/// A put whose data batch has been submitted: the rest (headers, syncs, publishing) follows its completion.
struct put_job {
  std::vector<key> keys;
  std::vector<put_item> items;
  op_result res;
  clock::time_point t0, deadline;
  std::shared_ptr<const batch_future> data;
  std::vector<std::size_t> heads;  // the items whose headers are written (those fine after the data)
  std::shared_ptr<std::uint8_t[]> header_pages;
  std::shared_ptr<const batch_future> headers;
};

/// The shared state of an asynchronous operation. Two kinds: a get of blocks that fit one checked range is a
/// batch of the transfer core (`batch`, with `job` until its outcome is made: its wait, descriptor, cancel
/// and deadline are the batch's); every other operation is finished by a store worker, which calls finish().
struct op_state {
  op_state() = default;
  ~op_state() {
    if (event_fd >= 0) ::close(event_fd);
  }
  op_state(const op_state&) = delete;
  op_state& operator=(const op_state&) = delete;

  /// The store's own completion descriptor (worker operations, and gets with nothing to read).
  void open_event() {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw error(errno_code(errno), "eventfd", "", -1, 0, "for a block store operation's completion");
    event_fd = fd;
  }
  /// Records the outcome; with `mutex` held.
  void set_ready_locked(op_result r) {
    result = std::move(r);
    ready = true;
    if (event_fd >= 0) {
      const std::uint64_t one = 1;
      // Level-triggered: the counter stays non-zero, nobody reads it.
      [[maybe_unused]] const auto n = ::write(event_fd, &one, sizeof one);
    }
    cv.notify_all();
  }
  void finish(op_result r) {
    std::lock_guard lock(mutex);
    set_ready_locked(std::move(r));
  }

  void track(const batch_future* f) {
    std::lock_guard lock(inflight_mutex);
    inflight.push_back(f);
    if (cancel.load()) f->cancel();
  }
  void untrack(const batch_future* f) {
    std::lock_guard lock(inflight_mutex);
    std::erase(inflight, f);
  }

  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;  // the outcome is made (result holds it)
  op_result result;
  int event_fd = -1;
  std::atomic<bool> cancel{false};  // cancel() was called
  std::mutex inflight_mutex;
  std::vector<const batch_future*> inflight;  // worker operations: their batches in flight

  bool core = false;                          // a core-batch get (below)
  std::shared_ptr<const batch_future> batch;  // its batch; a put's data batch (for released())
  std::unique_ptr<get_job> job;               // until the outcome is made
};

}  // namespace detail

namespace {

[[noreturn]] void bad(int e, const std::string& what) { throw error(errno_code(e), "block store: " + what); }

bool host_memory(const buffer_view& b) { return b.kind == memory_kind::host || b.kind == memory_kind::pinned; }

// Which counter an error of a key goes to.
enum class why { timeout, cancelled, no_space, io, checksum, other };
why classify(const std::error_code& ec) {
  if (ec == std::errc::timed_out) return why::timeout;
  if (ec == std::errc::operation_canceled) return why::cancelled;
  if (ec == std::errc::no_space_on_device) return why::no_space;
  if (ec == std::errc::bad_message) return why::checksum;
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::resource_unavailable_try_again) return why::other;
  return why::io;
}

// A range stopped before the batch's own deadline timer fired (a store-side wait that gave up at the
// deadline) timed out; only the caller's cancel() makes ECANCELED.
std::error_code range_error(const range_result& r, const detail::op_state* ctl) {
  if (r.error == std::errc::operation_canceled && (ctl == nullptr || !ctl->cancel.load())) {
    return errno_code(ETIMEDOUT);
  }
  return r.error;
}

std::string holder_names(const std::vector<std::filesystem::path>& paths) {
  std::string out;
  for (const auto& p : paths) out += (out.empty() ? "" : ", ") + detail::printable(p.string());
  return out;
}

// A fresh outcome for `n` keys: nothing decided yet.
op_result undecided(std::size_t n) {
  op_result res;
  res.ok.assign(n, false);
  res.errors.assign(n, errno_code(ENOENT));
  return res;
}

// Submits `ranges` as one batch checksummed by the transfer core, by `deadline`, ordered with `stream`. Returns
// the error when it could not start (then none of them moved).
std::error_code submit_checked(io_direction dir, std::span<const io_range> ranges, clock::time_point deadline,
                               void* stream, std::shared_ptr<const batch_future>& out) {
  batch_options bo;
  bo.deadline = deadline;
  bo.checksum = batch_checksum::crc32c;
  bo.stream = stream;
  try {
    out = std::make_shared<const batch_future>(submit(dir, ranges, bo));
  } catch (const std::system_error& e) {
    return e.code();
  } catch (const std::bad_alloc&) {
    return errno_code(ENOMEM);
  }
  return {};
}

// An error of a call the store made, as an errno for its keys: a CUDA or other library code becomes EIO.
std::error_code as_errno(const std::system_error& e) {
  return e.code().category() == std::generic_category() ? e.code() : errno_code(EIO);
}

std::error_code stop_code(const detail::op_state* ctl) {
  return errno_code(ctl != nullptr && ctl->cancel.load() ? ECANCELED : ETIMEDOUT);
}

// Whether the call has ended: its deadline passed or it was cancelled (stop_code says which).
bool stopped(clock::time_point deadline, const detail::op_state* ctl) {
  return clock::now() >= deadline || (ctl != nullptr && ctl->cancel.load());
}

// The verdict on one key's read: a hit (no error), bytes other than the block's or fewer of them (EBADMSG, a bad
// block), or the read's own error.
std::error_code read_verdict(const range_result& rr, bool sum_matches, const detail::op_state* ctl,
                             detail::shard::read_outcome& outcome) {
  outcome = detail::shard::read_outcome::other;
  if (rr.ok() && sum_matches) {
    outcome = detail::shard::read_outcome::hit;
    return {};
  }
  if (rr.ok() || rr.error == std::errc::bad_message || rr.error == std::errc::no_message_available) {
    outcome = detail::shard::read_outcome::bad;
    return errno_code(EBADMSG);
  }
  return range_error(rr, ctl);
}

}  // namespace

struct block_store::impl {
  store_options options;
  std::vector<detail::opened_volume> volumes;
  std::vector<std::unique_ptr<detail::shard>> shards;  // by volume index
  detail::quarantine held;  // batches past their deadline, with the memory and slots they hold
  std::atomic<std::uint64_t> next_sequence{1};
  recovery_info recovery;
  data_path path = data_path::host;
  std::vector<std::string> path_reasons;
  bool direct = false;
  std::string direct_reason;

  std::atomic<std::uint64_t> puts{0}, stored{0}, already_present{0}, put_failures{0}, not_admitted{0}, gets{0},
      hits{0}, misses{0}, checksum_failures{0}, timeouts{0}, cancelled{0}, io_errors{0}, no_space{0},
      bytes_written{0}, bytes_read{0};

  // Operations take `gate` shared; close() takes it exclusively, so it waits for them and none starts after.
  mutable std::shared_mutex gate;
  bool closed = false;

  // Submitted core-batch gets whose outcome is not made yet: made at the next call of the store (or by their
  // future), and by close().
  std::mutex pending_mutex;
  std::vector<std::shared_ptr<detail::op_state>> pending;

  // Operations the store finishes itself: a queue and up to `max_workers` threads, started as work arrives.
  std::mutex work_mutex;
  std::condition_variable work_cv;
  std::deque<std::function<void()>> work;
  std::vector<std::thread> workers;
  unsigned idle_workers = 0;
  unsigned max_workers = 4;
  bool stopping = false;
  // Submitted puts running as a chain of batch completions (chain_put); close() waits until none is left.
  std::condition_variable chains_cv;
  std::size_t chains = 0;

  explicit impl(const store_options& o);
  void open();
  detail::shard& shard_for(const key& k) const {
    return *shards[(k.hash() >> 32) % shards.size()];
  }
  /// Makes the outcome of submitted gets that are ready, and hands back what finished requests held.
  void reap();
  /// A get's key `i` decided: its result and counters, and the end of its read claim.
  void settle_key(op_result& res, std::size_t i, const key& k, detail::shard& sh, const detail::read_ticket& t,
                  std::error_code ec, detail::shard::read_outcome outcome) {
    if (ec) {
      res.errors[i] = ec;
      count_error(ec, false);
    } else {
      res.ok[i] = true;
      res.errors[i] = {};
    }
    sh.end_read(k, t, outcome);
  }
  void count_error(const std::error_code& ec, bool put) {
    switch (classify(ec)) {
      case why::timeout: ++timeouts; break;
      case why::cancelled: ++cancelled; break;
      case why::no_space: ++no_space; break;
      case why::checksum: ++checksum_failures; break;
      case why::io: ++io_errors; break;
      case why::other: break;
    }
    if (put && classify(ec) != why::other) ++put_failures;
  }
  void check_views(std::span<const key> keys, std::span<const buffer_view> views, bool reads, void* stream) const;
  bool one_range() const { return options.block_bytes <= k_piece_bytes; }

  // Gets of blocks that fit one checked range: one batch straight into `out`.
  // `t0`: when the call was made (op_result::seconds counts from it).
  std::shared_ptr<detail::op_state> start_get(std::span<const key> keys, std::span<const buffer_view> out,
                                              clock::time_point deadline, void* stream, clock::time_point t0);
  /// Makes the outcome of a core-batch get whose batch is ready (or that has none); once. With s.mutex held.
  void settle_get_locked(detail::op_state& s);
  // Gets of larger blocks: block after block through the store's memory.
  op_result run_large_get(std::span<const key> keys, std::span<const buffer_view> out, clock::time_point deadline,
                          detail::op_state* ctl, clock::time_point t0);
  // Their memory, one block each, kept idle between gets.
  idle_pool<int, std::shared_ptr<std::uint8_t[]>> large_idle{k_large_idle_bytes};
  std::shared_ptr<std::uint8_t[]> take_large_buffer() {
    if (auto b = large_idle.take(0)) return std::move(*b);
    return aligned_pages(options.block_bytes, false);  // every byte is read before any is used
  }
  void give_large_buffer(std::shared_ptr<std::uint8_t[]> b) noexcept {
    large_idle.give(0, detail::round_up(options.block_bytes, detail::page_bytes), std::move(b));
  }
  // Puts: the data batch (from the caller's memory, checksummed), then the headers.
  std::shared_ptr<detail::put_job> start_put(std::span<const key> keys, std::span<const buffer_view> blocks,
                                             clock::time_point deadline, void* stream, detail::op_state* ctl,
                                             clock::time_point t0);
  // The rest of a put, in steps: what the data batch did, the header batch, what it did, the outcome.
  // finish_put runs them waiting for each batch; chain_put runs each on the completion of the batch before it
  // (cache durability: nothing in it blocks), so that no thread waits for a submitted put.
  op_result finish_put(detail::put_job& job, detail::op_state* ctl);
  void chain_put(const std::shared_ptr<detail::put_job>& job, const std::shared_ptr<detail::op_state>& state);
  void chain_ended();
  /// Hands a finished put's batches that are not released yet to the quarantine, so that whichever callback
  /// drops the put's last reference never waits for a batch (the thread it would wait on may be the pool's
  /// last).
  void let_go(detail::put_job& job) noexcept;
  void data_done(detail::put_job& job, detail::op_state* ctl);
  void submit_headers(detail::put_job& job);
  void headers_done(detail::put_job& job, detail::op_state* ctl);
  op_result put_outcome(detail::put_job& job);
  void give_up(detail::put_job& job, const std::shared_ptr<const batch_future>& f,
               const std::shared_ptr<std::uint8_t[]>& memory);
  void sync_fine(detail::put_job& job);
  /// Waits for `f` (by its deadline at the latest), cancellable through `ctl`.
  static void wait_tracked(const batch_future& f, detail::op_state* ctl) {
    if (ctl != nullptr) ctl->track(&f);
    f.wait();
    if (ctl != nullptr) ctl->untrack(&f);
  }

  /// Queues work for a store worker; false once close() has begun.
  bool enqueue(std::function<void()> task);
  void worker_loop();
  void close();
  clock::time_point deadline_of(const op_options& o) const {
    return o.deadline ? *o.deadline : clock::now() + options.deadline;
  }
};

// ---- open ----

std::uint64_t capacity_for(std::uint64_t blocks, std::size_t block_bytes, std::size_t paths) {
  if (block_bytes == 0 || block_bytes > detail::max_block_bytes) {
    bad(EINVAL, fmt::format("block_bytes must be 1 .. 1 GiB, not {}", block_bytes));
  }
  if (paths == 0) bad(EINVAL, "no path");
  const std::uint64_t per_path = std::max<std::uint64_t>(1, (blocks + paths - 1) / paths);
  return detail::make_layout(block_bytes, per_path).budget_bytes() * paths;
}


block_store::impl::impl(const store_options& o) : options(o) {
  if (options.paths.empty()) bad(EINVAL, "no path given: pass one or more folders or block devices");
  if (options.block_bytes == 0 || options.block_bytes > detail::max_block_bytes) {
    bad(EINVAL, fmt::format("block_bytes must be 1 .. 1 GiB, not {}", options.block_bytes));
  }
  if (options.name_space.size() > detail::max_namespace_bytes) {
    bad(EINVAL, fmt::format("the namespace is {} bytes; at most {}", options.name_space.size(),
                            detail::max_namespace_bytes));
  }
  if (options.deadline <= std::chrono::nanoseconds::zero()) bad(EINVAL, "the deadline must be positive");
  const std::uint64_t n = options.paths.size();
  const std::uint64_t per_volume = options.capacity_bytes / n;
  if (per_volume > detail::max_volume_bytes) {
    bad(EINVAL, fmt::format("capacity_bytes {} is {} bytes per path; a file holds at most {}", options.capacity_bytes,
                            per_volume, detail::max_volume_bytes));
  }
  if (detail::slots_within(options.block_bytes, per_volume) == 0) {
    const std::uint64_t need = detail::make_layout(options.block_bytes, 1).budget_bytes() * n;
    bad(EINVAL, fmt::format("capacity_bytes {} is below one block per path: blocks of {} bytes on {} path(s) need "
                            "at least {} bytes (block, its header, the superblock and two checkpoints)",
                            options.capacity_bytes, options.block_bytes, n, need));
  }
  for (std::size_t i = 0; i < options.paths.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (options.paths[i] == options.paths[j] || std::filesystem::equivalent(options.paths[i], options.paths[j], ec)) {
        throw error(errno_code(EINVAL), "open block store", options.paths[i].string(), -1, 0, "given twice");
      }
    }
  }
  if (options.async_workers != 0) max_workers = options.async_workers;
  // A checksum is computed on bytes in host memory, so GPU memory must take the staged path (cuFile would move
  // it unchecked). Every file of the store is opened with this setting.
  if (options.io.mode != path_mode::host) options.io.mode = path_mode::staged;
}

void block_store::impl::open() {
  const auto t0 = clock::now();
  const std::size_t n = options.paths.size();
  for (const auto& p : options.paths) volumes.push_back(detail::open_volume(p, options.io));

  const std::uint64_t ns_hash = detail::namespace_hash(options.name_space);
  const std::uint64_t slots = detail::slots_within(options.block_bytes, options.capacity_bytes / n);
  const detail::layout geometry = detail::make_layout(options.block_bytes, slots);

  // Either every volume is new, or all belong to one store opened with the same parameters.
  std::size_t fresh = 0;
  for (const auto& v : volumes) {
    switch (v.kind) {
      case detail::page_kind::blank: ++fresh; break;
      case detail::page_kind::ok: break;
      case detail::page_kind::foreign:
        throw error(errno_code(EBADMSG), "open block store", v.data_path.string(), 0, detail::page_bytes,
                    v.block_device ? "the device holds data that is not a gdskit block store (its first 4 KiB are "
                                     "not zero); it is left untouched"
                                   : "not a gdskit block store file; it is left untouched (remove it to start over)");
      case detail::page_kind::damaged:
        throw error(errno_code(EBADMSG), "open block store", v.data_path.string(), 0, detail::page_bytes,
                    "the store's superblock is damaged; nothing was changed (remove the store to start over)");
      case detail::page_kind::newer:
        throw error(errno_code(EBADMSG), "open block store", v.data_path.string(), 0, detail::page_bytes,
                    "the store was written by a newer gdskit (format version above " +
                        std::to_string(detail::format_version) + ")");
    }
  }
  const bool created = fresh == n;
  detail::store_uuid uuid{};
  std::vector<std::uint32_t> index_of(n);
  if (fresh != 0 && fresh != n) {
    throw error(errno_code(EEXIST), "open block store", holder_names(options.paths), -1, 0,
                "some paths hold a store and others do not: open the store with the paths it was made with");
  }
  if (created) {
    std::random_device rd;
    for (auto& b : uuid) b = static_cast<std::uint8_t>(rd());
    const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
    for (std::size_t i = 0; i < n; ++i) {
      detail::superblock sb;
      sb.uuid = uuid;
      sb.volume_index = static_cast<std::uint32_t>(i);
      sb.volume_count = static_cast<std::uint32_t>(n);
      sb.block_bytes = geometry.block_bytes;
      sb.slot_bytes = geometry.slot_bytes;
      sb.slots = geometry.slots;
      sb.slot_offset = geometry.slot_offset;
      sb.checkpoint_offset = geometry.checkpoint_offset;
      sb.checkpoint_bytes = geometry.checkpoint_bytes;
      sb.capacity_bytes = options.capacity_bytes;
      sb.namespace_hash = ns_hash;
      sb.name_space = options.name_space;
      sb.created_unix_ns = static_cast<std::uint64_t>(now_ns);
      detail::create_volume(volumes[i], sb, geometry, options.mode == durability::persist, options.preallocate,
                            options.io);
      index_of[i] = static_cast<std::uint32_t>(i);
    }
  } else {
    uuid = volumes.front().sb.uuid;
    std::vector<bool> seen(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      const detail::superblock& sb = volumes[i].sb;
      const std::string where = volumes[i].data_path.string();
      auto refuse = [&](const std::string& what) {
        throw error(errno_code(EEXIST), "open block store", where, -1, 0, what + "; nothing was changed");
      };
      if (sb.block_bytes != options.block_bytes) {
        refuse(fmt::format("holds a store of {}-byte blocks, not {}", sb.block_bytes, options.block_bytes));
      }
      if (sb.name_space != options.name_space) {
        refuse(fmt::format("holds a store of namespace \"{}\", not \"{}\" (a store never serves blocks of another "
                           "namespace: use another folder)",
                           detail::printable(sb.name_space), detail::printable(options.name_space)));
      }
      if (sb.capacity_bytes != options.capacity_bytes) {
        refuse(fmt::format("holds a store of capacity_bytes {}, not {} (open it with its capacity, or remove it)",
                           sb.capacity_bytes, options.capacity_bytes));
      }
      if (sb.uuid != uuid || sb.volume_count != n || seen[sb.volume_index]) {
        refuse(fmt::format("belongs to a store of {} path(s) that is not the one the other paths hold",
                           sb.volume_count));
      }
      if (sb.slots != geometry.slots) refuse("holds a store laid out for another capacity");
      seen[sb.volume_index] = true;
      index_of[i] = sb.volume_index;
    }
  }

  shards.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    detail::shard_open so;
    so.file = volumes[i].file;
    // Headers through the page cache only where a memory page is no larger than the header's own 4 KiB: a
    // larger page would hold the start of the next slot's data, which the page's writeback could overwrite
    // with what it held before an O_DIRECT write of that data.
    if (static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) <= detail::page_bytes) {
      settings buffered = options.io;
      buffered.direct = direct_mode::off;
      so.headers =
          std::make_shared<const file_handle>(volumes[i].data_path, open_mode::read_write, open_options{}, buffered);
    }
    so.geometry = geometry;
    so.uuid = uuid;
    so.volume = index_of[i];
    so.namespace_hash = ns_hash;
    so.mode = options.mode;
    so.admit = options.admit;
    so.block_device = volumes[i].block_device;
    so.data_path = volumes[i].data_path;
    shards[index_of[i]] = std::make_unique<detail::shard>(std::move(so));
  }
  recovery.created = created;
  recovery.from_checkpoint = !created;
  recovery.clean = !created;
  std::uint64_t next = 1;
  for (auto& s : shards) next = std::max(next, s->recover(created, options.ignore_checkpoint, recovery));
  next_sequence = next;

  std::string gpu_why;
  const bool gpu = gpu_available(&gpu_why);

  const io_choice& choice = shards.front()->file().choice();
  direct = choice.direct;
  direct_reason = choice.direct_reason;
  if (gpu) {
    path = data_path::staged;
    path_reasons.push_back("blocks are checked (CRC32C) while they sit in host memory: GPU memory is reached "
                           "through the transfer core's pinned staging, one batched copy per round");
    try {
      const path_decision d = shards.front()->file().plan(buffer_view{nullptr, 0, memory_kind::device, 0});
      for (const auto& r : d.reasons) path_reasons.push_back("planner: " + r);
    } catch (const std::exception& e) {
      path_reasons.push_back(std::string("planner: ") + e.what());
    }
  } else {
    path = data_path::host;
    path_reasons.push_back("no usable GPU: " + gpu_why);
  }
  path_reasons.push_back(direct ? "files use O_DIRECT" : "files use the page cache: " + direct_reason);
  recovery.seconds = std::chrono::duration<double>(clock::now() - t0).count();
}

// ---- checks before any I/O ----

void block_store::impl::check_views(std::span<const key> keys, std::span<const buffer_view> views, bool reads,
                                    void* stream) const {
  const char* what = reads ? "out" : "blocks";
  if (keys.size() != views.size()) {
    bad(EINVAL, fmt::format("{} keys but {} {} rows", keys.size(), views.size(), what));
  }
  bool gpu_checked = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].type() == key::kind::none) bad(EINVAL, fmt::format("key {} is empty", i));
    const buffer_view& v = views[i];
    if (v.nbytes != options.block_bytes) {
      bad(EINVAL, fmt::format("{} row {} is {} bytes; the store's blocks are {} bytes", what, i, v.nbytes,
                              options.block_bytes));
    }
    if (v.data == nullptr) bad(EFAULT, fmt::format("{} row {} has no memory (null)", what, i));
    if (!host_memory(v) && !gpu_checked) {
      std::string why;
      if (!gpu_available(&why)) bad(ENODEV, fmt::format("{} row {} is GPU memory but no GPU is usable: {}", what, i, why));
      gpu_checked = true;
    }
  }
  if (stream != nullptr && !gpu_checked) {
    std::string why;
    if (!gpu_available(&why)) bad(ENODEV, "a CUDA stream was given but no GPU is usable: " + why);
  }
  if (reads) {
    // Two keys read into the same bytes would race.
    std::vector<std::size_t> order(views.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto addr = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(views[i].data); };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return addr(a) < addr(b); });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::size_t p = order[k - 1], i = order[k];
      if (addr(i) < addr(p) + views[p].nbytes && views[i].device == views[p].device) {
        bad(EINVAL, fmt::format("out rows {} and {} overlap: every key needs its own row", std::min(p, i), std::max(p, i)));
      }
    }
  }
}

// ---- gets ----

void block_store::impl::reap() {
  std::vector<std::shared_ptr<detail::op_state>> done;
  {
    std::lock_guard lock(pending_mutex);
    for (std::size_t i = 0; i < pending.size();) {
      if (pending[i]->batch->ready()) {
        done.push_back(std::move(pending[i]));
        pending[i] = std::move(pending.back());
        pending.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& s : done) {
    std::lock_guard lock(s->mutex);
    settle_get_locked(*s);
  }
  held.reap();
  for (auto& s : shards) s->held().reap();
}

std::shared_ptr<detail::op_state> block_store::impl::start_get(std::span<const key> keys,
                                                               std::span<const buffer_view> out,
                                                               clock::time_point deadline, void* stream,
                                                               clock::time_point t0) {
  auto s = std::make_shared<detail::op_state>();
  s->core = true;
  auto job = std::make_unique<detail::get_job>();
  job->store = this;
  job->t0 = t0;
  job->keys.assign(keys.begin(), keys.end());
  job->res = undecided(keys.size());
  reap();
  gets += keys.size();

  // Each block straight from its slot into the caller's row. The transfer core checks it against the CRC32C
  // its header recorded while it sits in staging memory, and copies it into the row only when it matches.
  std::vector<io_range> ranges;
  ranges.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    detail::shard& sh = shard_for(keys[i]);
    const auto t = sh.begin_read(keys[i]);
    if (!t) continue;
    job->items.push_back({i, &sh, *t});
    io_range r{&sh.file(), sh.geometry().slot_position(t->slot), out[i]};
    r.crc32c = t->data_crc;
    ranges.push_back(r);
  }
  if (!ranges.empty()) {
    job->submitted = clock::now();
    if (const std::error_code failed = submit_checked(io_direction::read, ranges, deadline, stream, s->batch)) {
      for (const auto& it : job->items) {
        job->res.errors[it.i] = failed;
        count_error(failed, false);
        it.sh->end_read(job->keys[it.i], it.t, detail::shard::read_outcome::other);
      }
      job->items.clear();
    }
  }
  s->job = std::move(job);
  if (!s->batch) {
    // Nothing to read: decided now, with a descriptor of its own that is readable at once.
    s->open_event();
    std::lock_guard lock(s->mutex);
    settle_get_locked(*s);
  }
  return s;
}

void block_store::impl::settle_get_locked(detail::op_state& s) {
  if (s.ready) return;
  detail::get_job& j = *s.job;
  if (s.batch) {
    const batch_result& r = s.batch->get();
    for (std::size_t k = 0; k < j.items.size(); ++k) {
      const detail::get_item& it = j.items[k];
      const range_result& rr = r.ranges[k];
      bytes_read += rr.nbytes;
      // A range reported moved whose sum differs would be a route that did not check; the store's files send
      // GPU memory through staging, so that cannot happen, and the key is a miss all the same.
      auto outcome = detail::shard::read_outcome::other;
      const std::error_code ec = read_verdict(rr, rr.crc32c == it.t.data_crc, &s, outcome);
      settle_key(j.res, it.i, j.keys[it.i], *it.sh, it.t, ec, outcome);
    }
    // Checked reads move through the core's staging, so once the batch is ready nothing lands in `out`; a
    // request the kernel still holds targets that staging only, and the batch is kept until it ends.
    if (!detail::settled(*s.batch)) held.add(s.batch, {});
  }
  for (bool b : j.res.ok) j.res.ok_count += b ? 1 : 0;
  hits += j.res.ok_count;
  misses += j.res.ok.size() - j.res.ok_count;
  // Until the batch ended, not until the store noticed (a submitted get is settled when it is first seen).
  j.res.seconds = s.batch ? std::chrono::duration<double>(j.submitted - j.t0).count() + s.batch->get().seconds
                          : std::chrono::duration<double>(clock::now() - j.t0).count();
  s.set_ready_locked(std::move(j.res));
  s.job.reset();
}

op_result block_store::impl::run_large_get(std::span<const key> keys, std::span<const buffer_view> out,
                                           clock::time_point deadline, detail::op_state* ctl,
                                           clock::time_point t0) {
  const std::size_t n = keys.size();
  op_result res = undecided(n);
  reap();
  gets += n;
  const std::size_t block_bytes = options.block_bytes;
  // Blocks too large to be checked as one range of the core: each read into the store's memory, checked there
  // and copied into its row, in the order of the keys, while the next ones are read.
  const std::size_t depth =
      block_bytes > k_large_alone_bytes ? 1 : std::clamp<std::size_t>(k_large_get_bytes / block_bytes, 2, 8);
  struct reading {
    std::size_t i = 0;
    detail::shard* sh = nullptr;
    detail::read_ticket t;
    std::shared_ptr<std::uint8_t[]> buf;
    std::shared_ptr<const batch_future> f;
  };
  std::deque<reading> flight;
  std::shared_ptr<std::uint8_t[]> spare;  // a buffer too large for the pool, free for the next key
  auto decide = [&](std::size_t i, detail::shard& sh, const detail::read_ticket& t, std::error_code ec,
                    detail::shard::read_outcome outcome) { settle_key(res, i, keys[i], sh, t, ec, outcome); };
  // Starts the read of the next held key; false when no key is left to start.
  std::size_t next = 0;
  auto start_next = [&]() -> bool {
    while (next < n) {
      const std::size_t i = next++;
      detail::shard& sh = shard_for(keys[i]);
      const auto t = sh.begin_read(keys[i]);
      if (!t) continue;
      std::error_code ec;
      if (stopped(deadline, ctl)) {
        ec = stop_code(ctl);
      } else {
        try {
          reading r{i, &sh, *t, spare ? std::move(spare) : take_large_buffer(), nullptr};
          const io_range range{&sh.file(), sh.geometry().slot_position(t->slot),
                               buffer_view::host(r.buf.get(), block_bytes)};
          batch_options bo;
          bo.deadline = deadline;
          bo.exact = true;
          r.f = std::make_shared<const batch_future>(submit_reads(std::span<const io_range>(&range, 1), bo));
          flight.push_back(std::move(r));
          return true;
        } catch (const std::system_error& e) {
          ec = as_errno(e);
        } catch (const std::bad_alloc&) {
          ec = errno_code(ENOMEM);
        }
      }
      decide(i, sh, *t, ec, detail::shard::read_outcome::other);
    }
    return false;
  };
  // Checks the oldest read once it has ended and copies it into its row.
  auto finish_oldest = [&] {
    reading r = std::move(flight.front());
    flight.pop_front();
    std::error_code ec;
    auto outcome = detail::shard::read_outcome::other;
    try {
      wait_tracked(*r.f, ctl);
      const range_result& rr = r.f->get().ranges[0];
      bytes_read += rr.nbytes;
      ec = read_verdict(rr, rr.ok() && crc32c(r.buf.get(), block_bytes) == r.t.data_crc, ctl, outcome);
      if (!ec && stopped(deadline, ctl)) {
        ec = stop_code(ctl);  // landed, but after the call's end: its row stays untouched
        outcome = detail::shard::read_outcome::other;
      } else if (!ec) {
        if (host_memory(out[r.i])) {
          std::memcpy(out[r.i].data, r.buf.get(), block_bytes);
        } else {
          copy_into(out[r.i], 0, r.buf.get(), block_bytes);
        }
      }
    } catch (const std::system_error& e) {
      ec = as_errno(e);
      outcome = detail::shard::read_outcome::other;
    } catch (const std::bad_alloc&) {
      ec = errno_code(ENOMEM);
      outcome = detail::shard::read_outcome::other;
    }
    decide(r.i, *r.sh, r.t, ec, outcome);
    if (detail::settled(*r.f)) {
      if (block_bytes > k_large_idle_bytes) {
        spare = std::move(r.buf);  // too large to keep between calls: kept for this call's next key
      } else {
        give_large_buffer(std::move(r.buf));
      }
    } else {
      held.add(r.f, [keep = std::move(r.buf)] {});  // a request past the deadline may still land in it
    }
  };
  try {
    while (flight.size() < depth && start_next()) {
    }
    while (!flight.empty()) {
      finish_oldest();
      while (flight.size() < depth && start_next()) {
      }
    }
  } catch (...) {
    // Whatever failed past the reads' own errors: the reads still in flight end (by their deadline), keep their
    // memory and give back their claims.
    while (!flight.empty()) {
      reading r = std::move(flight.front());
      flight.pop_front();
      r.f->wait();
      decide(r.i, *r.sh, r.t, errno_code(ENOMEM), detail::shard::read_outcome::other);
      if (!detail::settled(*r.f)) held.add(r.f, [keep = std::move(r.buf)] {});
    }
    throw;
  }
  for (bool b : res.ok) res.ok_count += b ? 1 : 0;
  hits += res.ok_count;
  misses += n - res.ok_count;
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

// ---- puts ----

std::shared_ptr<detail::put_job> block_store::impl::start_put(std::span<const key> keys,
                                                              std::span<const buffer_view> blocks,
                                                              clock::time_point deadline, void* stream,
                                                              detail::op_state* ctl, clock::time_point t0) {
  auto job = std::make_shared<detail::put_job>();
  job->t0 = t0;
  job->deadline = deadline;
  job->keys.assign(keys.begin(), keys.end());
  const std::size_t n = keys.size();
  job->res = undecided(n);
  reap();
  puts += n;
  auto decide = [&](std::size_t i, std::error_code ec) {
    job->res.errors[i] = ec;
    if (ec) count_error(ec, true);
  };
  const std::size_t block_bytes = options.block_bytes;
  // Every block's data goes straight from the caller's memory to its slot, checksummed by the transfer core on
  // the way (for GPU memory in the pinned staging it crosses anyway); its header follows once the data is
  // written and its sum known (finish_put). A block larger than one checked range goes in pieces.
  std::vector<io_range> ranges;
  try {
    for (std::size_t i = 0; i < n; ++i) {
      if (stopped(deadline, ctl)) {
        for (; i < n; ++i) decide(i, stop_code(ctl));
        break;
      }
      detail::shard& sh = shard_for(keys[i]);
      const std::uint64_t seq = next_sequence.fetch_add(1);
      std::uint32_t slot = 0;
      std::error_code ec;
      switch (sh.begin_write(keys[i], seq, next_sequence.load(), deadline, slot, ec)) {
        case detail::write_claim::present:
          job->res.ok[i] = true;
          job->res.errors[i] = {};
          ++already_present;
          continue;
        case detail::write_claim::not_admitted:
          ++not_admitted;
          decide(i, errno_code(EAGAIN));
          continue;
        case detail::write_claim::no_space:
        case detail::write_claim::failed:
          decide(i, ec);
          continue;
        case detail::write_claim::write:
          break;
      }
      detail::put_item it;
      it.i = i;
      it.sh = &sh;
      it.slot = slot;
      it.sequence = seq;
      it.first_range = ranges.size();
      job->items.push_back(it);
      const std::uint64_t at = sh.geometry().slot_position(slot);
      for (std::size_t off = 0; off < block_bytes; off += k_piece_bytes) {
        ranges.push_back({&sh.file(), at + off, blocks[i].sub(off, std::min(k_piece_bytes, block_bytes - off))});
      }
      job->items.back().ranges = ranges.size() - it.first_range;
    }
  } catch (...) {
    for (const auto& it : job->items) it.sh->abandon(it.slot, false);
    throw;
  }
  if (!ranges.empty()) {
    if (const std::error_code failed = submit_checked(io_direction::write, ranges, deadline, stream, job->data)) {
      for (const auto& it : job->items) {
        it.sh->abandon(it.slot, false);
        decide(it.i, failed);
      }
      job->items.clear();
    }
  }
  return job;
}

// Gives up the items that failed and are not given up yet. When `f` (the batch they failed in) may still write
// past its deadline, their slots wait in the quarantine with `memory` until it has ended.
void block_store::impl::give_up(detail::put_job& job, const std::shared_ptr<const batch_future>& f,
                                const std::shared_ptr<std::uint8_t[]>& memory) {
  if (std::none_of(job.items.begin(), job.items.end(), [](const auto& it) { return it.ec && !it.given_up; })) return;
  // Never waits (it may run in a batch's completion callback): a batch not released yet keeps the slots in the
  // quarantine until it is.
  const bool late = f != nullptr && !f->released();
  std::vector<std::pair<detail::shard*, std::uint32_t>> slots;
  for (detail::put_item& it : job.items) {
    if (!it.ec || it.given_up) continue;
    it.given_up = true;
    it.sh->abandon(it.slot, late);
    if (late) slots.emplace_back(it.sh, it.slot);
    job.res.errors[it.i] = it.ec;
    count_error(it.ec, true);
  }
  if (late) {
    held.add(f, [slots = std::move(slots), memory] {
      for (auto [sh, s] : slots) sh->release_slot(s);
    });
  }
}

// fdatasync of every volume an item that is still fine was written to; a failed sync fails its items.
void block_store::impl::sync_fine(detail::put_job& job) {
  std::vector<detail::shard*> touched;
  for (const auto& it : job.items) {
    if (!it.ec) touched.push_back(it.sh);
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (detail::shard* sh : touched) {
    const std::error_code ec = detail::sync_until(sh->file_ptr(), job.deadline);
    for (auto& it : job.items) {
      if (ec && !it.ec && it.sh == sh) it.ec = ec;
    }
  }
}

void block_store::impl::data_done(detail::put_job& job, detail::op_state* ctl) {
  const std::size_t block_bytes = options.block_bytes;
  const batch_result& r = job.data->get();
  for (auto& it : job.items) {
    std::uint32_t crc = 0;
    for (std::size_t k = 0; k < it.ranges; ++k) {
      const range_result& rr = r.ranges[it.first_range + k];
      if (!rr.ok()) {
        if (!it.ec) it.ec = range_error(rr, ctl);
        continue;
      }
      bytes_written += rr.nbytes;
      const std::size_t len = std::min(k_piece_bytes, block_bytes - k * k_piece_bytes);
      crc = k == 0 ? rr.crc32c : detail::crc32c_combine(crc, rr.crc32c, len);
    }
    it.crc = crc;
  }
  give_up(job, job.data, nullptr);
}

// Data first, then the headers (through the page cache; persist: each synced), so a header on disk describes data
// on disk; in cache mode a crash between the two leaves a header that does not match the data, and the block a
// miss.
void block_store::impl::submit_headers(detail::put_job& job) {
  const detail::layout& g = shards.front()->geometry();
  auto& items = job.items;
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (!items[k].ec) job.heads.push_back(k);
  }
  if (job.heads.empty()) return;
  try {
    job.header_pages = aligned_pages(job.heads.size() * detail::page_bytes);
    std::vector<io_range> ranges;
    ranges.reserve(job.heads.size());
    for (std::size_t j = 0; j < job.heads.size(); ++j) {
      const detail::put_item& it = items[job.heads[j]];
      detail::block_header h;
      h.uuid = it.sh->uuid();
      h.namespace_hash = it.sh->namespace_hash();
      h.sequence = it.sequence;
      h.volume = it.sh->volume();
      h.slot = it.slot;
      h.data_bytes = options.block_bytes;
      h.data_crc = it.crc;
      h.k = job.keys[it.i];
      std::uint8_t* page = job.header_pages.get() + j * detail::page_bytes;
      detail::encode_header(h, page);
      ranges.push_back({&it.sh->header_file(), g.header_position(it.slot), buffer_view::host(page, detail::page_bytes)});
    }
    batch_options bo;
    bo.deadline = job.deadline;
    job.headers = std::make_shared<const batch_future>(submit_writes(ranges, bo));
  } catch (const std::system_error& e) {
    for (std::size_t k : job.heads) items[k].ec = e.code();
  } catch (const std::bad_alloc&) {
    for (std::size_t k : job.heads) items[k].ec = errno_code(ENOMEM);
  }
}

void block_store::impl::headers_done(detail::put_job& job, detail::op_state* ctl) {
  const batch_result& r = job.headers->get();
  for (std::size_t j = 0; j < job.heads.size(); ++j) {
    const range_result& rr = r.ranges[j];
    if (rr.ok()) {
      bytes_written += rr.nbytes;
    } else {
      job.items[job.heads[j]].ec = range_error(rr, ctl);
    }
  }
  give_up(job, job.headers, job.header_pages);
}

op_result block_store::impl::put_outcome(detail::put_job& job) {
  give_up(job, nullptr, nullptr);  // failed syncs and header submissions: nothing of theirs is in flight
  op_result& res = job.res;
  for (const auto& it : job.items) {
    if (it.ec) continue;
    it.sh->publish(it.slot, it.crc);
    res.ok[it.i] = true;
    res.errors[it.i] = {};
    ++stored;
  }
  for (bool b : res.ok) res.ok_count += b ? 1 : 0;
  res.seconds = std::chrono::duration<double>(clock::now() - job.t0).count();
  return res;
}

op_result block_store::impl::finish_put(detail::put_job& job, detail::op_state* ctl) {
  const bool persist = options.mode == durability::persist;
  if (job.data) {
    wait_tracked(*job.data, ctl);
    data_done(job, ctl);
    if (persist) sync_fine(job);
    submit_headers(job);
    if (job.headers) {
      wait_tracked(*job.headers, ctl);
      headers_done(job, ctl);
    }
    if (persist && !job.heads.empty()) sync_fine(job);
  }
  return put_outcome(job);
}

void block_store::impl::chain_put(const std::shared_ptr<detail::put_job>& job,
                                  const std::shared_ptr<detail::op_state>& state) {
  // Each step runs on the completion of the batch before it and returns whether the put has ended; whatever
  // goes wrong in one, the put ends (its unfinished keys failed with the error).
  auto step = [this, job, state](auto&& body) noexcept {
    bool ended = true;
    std::error_code failed;
    try {
      ended = body();
    } catch (const std::system_error& e) {
      failed = e.code();
    } catch (const std::bad_alloc&) {
      failed = errno_code(ENOMEM);
    } catch (...) {
      failed = errno_code(EIO);
    }
    if (failed) {
      // Neither batch is waited for or cancelled through the operation any more.
      state->untrack(job->data.get());
      if (job->headers) state->untrack(job->headers.get());
      try {
        for (detail::put_item& it : job->items) {
          if (!it.ec) it.ec = failed;
        }
        give_up(*job, job->headers ? job->headers : job->data, job->header_pages);
        state->finish(put_outcome(*job));
      } catch (...) {
        // Out of memory again: every key failed (in the outcome made at the start, which needs no memory); the
        // slots not given back stay claimed until the store reopens.
        std::fill(job->res.ok.begin(), job->res.ok.end(), false);
        std::fill(job->res.errors.begin(), job->res.errors.end(), errno_code(ENOMEM));
        job->res.ok_count = 0;
        std::lock_guard lock(state->mutex);
        if (!state->ready) state->set_ready_locked(std::move(job->res));
      }
    }
    if (ended) {
      let_go(*job);
      chain_ended();
    }
  };
  auto headers_written = [this, job, state, step] {
    step([&] {
      state->untrack(job->headers.get());
      headers_done(*job, state.get());
      state->finish(put_outcome(*job));
      return true;
    });
  };
  job->data->on_ready([this, job, state, step, headers_written] {
    step([&] {
      state->untrack(job->data.get());
      data_done(*job, state.get());
      submit_headers(*job);
      if (!job->headers) {
        state->finish(put_outcome(*job));
        return true;
      }
      state->track(job->headers.get());
      job->headers->on_ready(headers_written);
      return false;
    });
  });
}

void block_store::impl::let_go(detail::put_job& job) noexcept {
  try {
    if (job.headers && !job.headers->released()) held.add(job.headers, [pages = job.header_pages] {});
    job.headers.reset();
    if (job.data && !job.data->released()) held.add(job.data, {});
    job.data.reset();
  } catch (...) {  // out of memory for the callback's copy: the batch stays with the job
  }
}

void block_store::impl::chain_ended() {
  std::lock_guard lock(work_mutex);
  if (--chains == 0) chains_cv.notify_all();
}

// ---- asynchronous operations ----

bool block_store::impl::enqueue(std::function<void()> task) {
  std::lock_guard lock(work_mutex);
  if (stopping) return false;  // closing: no worker would take it
  work.push_back(std::move(task));
  if (idle_workers == 0 && workers.size() < max_workers) {
    workers.emplace_back([this] { worker_loop(); });
  } else {
    work_cv.notify_one();
  }
  return true;
}

void block_store::impl::worker_loop() {
  std::unique_lock lock(work_mutex);
  for (;;) {
    ++idle_workers;
    work_cv.wait(lock, [&] { return stopping || !work.empty(); });
    --idle_workers;
    if (work.empty()) return;  // stopping, and nothing left
    auto task = std::move(work.front());
    work.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}


// ---- close ----

void block_store::impl::close() {
  {
    std::lock_guard lock(work_mutex);
    stopping = true;
  }
  work_cv.notify_all();
  for (auto& t : workers) t.join();  // queued operations run to their end (each has a deadline)
  workers.clear();
  {
    // Puts running as chains of batch completions end by their deadlines too.
    std::unique_lock lock(work_mutex);
    chains_cv.wait(lock, [&] { return chains == 0; });
  }
  large_idle.clear();

  std::unique_lock exclusive(gate);
  if (closed) return;
  closed = true;
  // Submitted gets end by their deadline; their outcome is made now, so that their claims on slots end.
  std::vector<std::shared_ptr<detail::op_state>> left;
  {
    std::lock_guard lock(pending_mutex);
    left.swap(pending);
  }
  for (auto& s : left) {
    s->batch->wait();
    std::lock_guard lock(s->mutex);
    settle_get_locked(*s);
  }
  // Requests the kernel still holds past a deadline end when the device answers; their memory cannot be freed
  // before. A device that never answers keeps this store's memory for the life of the process.
  const auto limit = std::max<std::chrono::nanoseconds>(std::chrono::seconds(30), 4 * options.deadline);
  bool drained = held.drain(limit);
  for (auto& s : shards) drained = s->held().drain(limit) && drained;
  std::exception_ptr first;
  if (drained) {
    const auto deadline = clock::now() + std::max<std::chrono::nanoseconds>(std::chrono::seconds(10), options.deadline);
    for (auto& s : shards) {
      try {
        s->final_checkpoint(next_sequence.load(), deadline);
        if (options.mode == durability::persist) s->file().sync();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
  }
  if (!drained) {
    std::cerr << "gdskit: block store " << holder_names(options.paths)
              << ": requests past their deadline are still held by the kernel; their memory is kept\n";
  }
  if (first) std::rethrow_exception(first);
}

// ---- block_store ----

block_store::block_store() noexcept = default;

block_store::block_store(const store_options& options) {
  auto p = std::make_shared<impl>(options);
  p->open();
  impl_ = std::move(p);
}

block_store::~block_store() {
  try {
    close();
  } catch (const std::exception& e) {
    std::cerr << "gdskit: closing a block store: " << e.what() << "\n";
  }
}

block_store::block_store(block_store&&) noexcept = default;
block_store& block_store::operator=(block_store&& o) noexcept {
  if (this != &o) {
    try {
      close();
    } catch (const std::exception& e) {
      std::cerr << "gdskit: closing a block store: " << e.what() << "\n";
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

namespace {

block_store::impl& open_impl(const std::shared_ptr<block_store::impl>& p) {
  if (!p) bad(EBADF, "the store is closed");
  return *p;
}

// The outcome of an operation that could not run: every key failed with `ec`.
op_result all_failed(std::size_t n, std::error_code ec) {
  op_result r;
  r.ok.assign(n, false);
  r.errors.assign(n, ec);
  return r;
}

template <class F>
op_result guarded(std::size_t n, F&& f) {
  try {
    return f();
  } catch (const std::system_error& e) {
    return all_failed(n, e.code());
  } catch (const std::bad_alloc&) {
    return all_failed(n, errno_code(ENOMEM));
  }
}

}  // namespace

#define GDSKIT_KV_SHARED_GATE(p)                \
  std::shared_lock gate_lock((p).gate);         \
  if ((p).closed) bad(EBADF, "the store is closed")

op_result block_store::put(std::span<const key> keys, std::span<const buffer_view> blocks, const op_options& options) {
  const auto t0 = clock::now();
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, blocks, false, options.stream);
  const auto job = p.start_put(keys, blocks, p.deadline_of(options), options.stream, nullptr, t0);
  return p.finish_put(*job, nullptr);
}

op_result block_store::get(std::span<const key> keys, std::span<const buffer_view> out, const op_options& options) {
  const auto t0 = clock::now();
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, out, true, options.stream);
  const auto deadline = p.deadline_of(options);
  if (!p.one_range()) return p.run_large_get(keys, out, deadline, nullptr, t0);
  const auto s = p.start_get(keys, out, deadline, options.stream, t0);
  if (s->batch) s->batch->wait();  // by the deadline at the latest
  std::lock_guard lock(s->mutex);
  p.settle_get_locked(*s);
  return std::move(s->result);
}

op_future block_store::submit_put(std::span<const key> keys, std::span<const buffer_view> blocks,
                                  const op_options& options) {
  const auto t0 = clock::now();
  impl& p = open_impl(impl_);
  auto state = std::make_shared<detail::op_state>();
  state->open_event();
  // The gate stays held until the rest is queued: close() then waits for the worker (or for this thread, when
  // close has begun and the rest runs here), never for slots claimed by a put it does not know of.
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, blocks, false, options.stream);
  // The data batch starts here, so that a stream is waited for at the point of this call.
  std::shared_ptr<detail::put_job> job =
      p.start_put(keys, blocks, p.deadline_of(options), options.stream, state.get(), t0);
  state->batch = job->data;
  auto rest = [&p, state, job] {
    state->finish(guarded(job->keys.size(), [&] { return p.finish_put(*job, state.get()); }));
  };
  // Nothing written (every key held already, refused or failed): the outcome is made here.
  if (!job->data) {
    rest();
    return op_future(std::move(state));
  }
  // Cache durability: the rest runs on the batches' completions (no thread waits for it). Persist: a store
  // worker runs it, as its syncs block. Once close() has begun, this thread does.
  if (p.options.mode == durability::cache) {
    bool chained = false;
    {
      std::lock_guard lock(p.work_mutex);
      if (!p.stopping) {
        ++p.chains;
        chained = true;
      }
    }
    if (chained) {
      try {
        state->track(job->data.get());
        p.chain_put(job, state);
      } catch (...) {
        state->untrack(job->data.get());
        p.chain_ended();
        rest();
      }
      return op_future(std::move(state));
    }
  }
  if (!p.enqueue([&p, rest] {
        std::shared_lock lock(p.gate);
        rest();
      })) {
    rest();
  }
  return op_future(std::move(state));
}

op_future block_store::submit_get(std::span<const key> keys, std::span<const buffer_view> out,
                                  const op_options& options) {
  const auto t0 = clock::now();
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, out, true, options.stream);
  const auto deadline = p.deadline_of(options);
  if (p.one_range()) {
    std::shared_ptr<detail::op_state> s = p.start_get(keys, out, deadline, options.stream, t0);
    {
      std::lock_guard lock(s->mutex);
      if (s->ready) return op_future(std::move(s));
    }
    std::lock_guard lock(p.pending_mutex);
    p.pending.push_back(s);
    return op_future(std::move(s));
  }
  auto state = std::make_shared<detail::op_state>();
  state->open_event();
  std::vector<key> k(keys.begin(), keys.end());
  std::vector<buffer_view> v(out.begin(), out.end());
  auto run = [&p, state, k = std::move(k), v = std::move(v), deadline, t0] {
    state->finish(guarded(k.size(), [&] { return p.run_large_get(k, v, deadline, state.get(), t0); }));
  };
  // Blocks too large for one checked range are copied into `out` by the store itself: with a stream, before
  // this returns, so that work queued on it afterwards sees them.
  if (options.stream != nullptr || !p.enqueue([&p, run] {
        std::shared_lock lock(p.gate);
        run();
      })) {
    run();
  }
  return op_future(std::move(state));
}

std::vector<bool> block_store::lookup(std::span<const key> keys) const {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  std::vector<bool> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = keys[i].type() != key::kind::none && p.shard_for(keys[i]).contains(keys[i]);
  return out;
}

std::size_t block_store::prefix(std::span<const key> keys) const {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  std::size_t n = 0;
  while (n < keys.size() && keys[n].type() != key::kind::none && p.shard_for(keys[n]).contains(keys[n])) ++n;
  return n;
}

std::vector<bool> block_store::pin(std::span<const key> keys) {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  std::vector<bool> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = keys[i].type() != key::kind::none && p.shard_for(keys[i]).pin(keys[i]);
  return out;
}

void block_store::unpin(std::span<const key> keys) {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  for (const key& k : keys) {
    if (k.type() != key::kind::none) p.shard_for(k).unpin(k);
  }
}

store_stats block_store::stats() const {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.reap();
  store_stats s;
  const detail::layout& g = p.shards.front()->geometry();
  s.capacity_bytes = p.options.capacity_bytes;
  s.block_bytes = p.options.block_bytes;
  s.slot_bytes = g.slot_bytes;
  s.slots = g.slots * p.shards.size();
  for (const auto& sh : p.shards) {
    const auto c = sh->count();
    s.blocks += c.blocks;
    s.pinned += c.pinned;
    s.evictions += c.evictions;
    s.checkpoints += c.checkpoints;
    s.bytes_written += c.checkpoint_bytes;
    s.physical_bytes += sh->physical_bytes();
    s.quarantined += sh->held().size();
  }
  s.puts = p.puts;
  s.stored = p.stored;
  s.already_present = p.already_present;
  s.put_failures = p.put_failures;
  s.not_admitted = p.not_admitted;
  s.gets = p.gets;
  s.hits = p.hits;
  s.misses = p.misses;
  s.checksum_failures = p.checksum_failures;
  s.timeouts = p.timeouts;
  s.cancelled = p.cancelled;
  s.io_errors = p.io_errors;
  s.no_space = p.no_space;
  s.bytes_written += p.bytes_written;
  s.bytes_read = p.bytes_read + p.recovery.bytes_read;
  s.quarantined += p.held.size();
  s.recovery = p.recovery;
  s.mode = p.options.mode;
  s.path = p.path;
  s.path_reasons = p.path_reasons;
  s.direct = p.direct;
  s.direct_reason = p.direct_reason;
  return s;
}

void block_store::close() {
  if (!impl_) return;
  std::shared_ptr<impl> p = std::move(impl_);
  p->close();
  // A store whose quarantine could not drain keeps its memory: requests still in the kernel target it.
  if (p->held.size() != 0 || std::any_of(p->shards.begin(), p->shards.end(), [](const auto& s) { return s->held().size() != 0; })) {
    static std::mutex kept_mutex;
    static std::vector<std::shared_ptr<impl>>* kept = new std::vector<std::shared_ptr<impl>>();
    std::lock_guard lock(kept_mutex);
    kept->push_back(std::move(p));
  }
}

const store_options& block_store::options() const { return open_impl(impl_).options; }

// ---- op_future ----

namespace {
detail::op_state& need(const std::shared_ptr<detail::op_state>& s) {
  if (!s) bad(EINVAL, "op_future: empty (default-constructed or moved-from)");
  return *s;
}

// A core-batch get whose batch is ready: its outcome, made once (its job points at the store, which close()
// keeps until every pending get is settled). With s.mutex held.
void settle_locked(detail::op_state& s) {
  if (!s.ready) s.job->store->settle_get_locked(s);
}
}  // namespace

op_future::op_future() noexcept = default;
op_future::op_future(std::shared_ptr<detail::op_state> state) noexcept : state_(std::move(state)) {}
op_future::~op_future() {
  if (state_) wait();
}
op_future::op_future(op_future&&) noexcept = default;
op_future& op_future::operator=(op_future&& o) noexcept {
  if (this != &o) {
    if (state_) wait();
    state_ = std::move(o.state_);
  }
  return *this;
}

bool op_future::ready() const {
  auto& s = need(state_);
  std::lock_guard lock(s.mutex);
  if (!s.ready && s.core && s.batch->ready()) settle_locked(s);
  return s.ready;
}
void op_future::wait() const {
  auto& s = need(state_);
  if (s.core) {
    {
      std::lock_guard lock(s.mutex);
      if (s.ready) return;
    }
    s.batch->wait();  // by its deadline at the latest
    std::lock_guard lock(s.mutex);
    settle_locked(s);
    return;
  }
  std::unique_lock lock(s.mutex);
  s.cv.wait(lock, [&] { return s.ready; });
}
bool op_future::wait_for(std::chrono::nanoseconds timeout) const {
  auto& s = need(state_);
  if (s.core) {
    {
      std::lock_guard lock(s.mutex);
      if (s.ready) return true;
    }
    if (!s.batch->wait_for(timeout)) return false;
    std::lock_guard lock(s.mutex);
    settle_locked(s);
    return true;
  }
  std::unique_lock lock(s.mutex);
  return s.cv.wait_for(lock, timeout, [&] { return s.ready; });
}
int op_future::fd() const {
  auto& s = need(state_);
  return s.core && s.batch ? s.batch->fd() : s.event_fd;
}
bool op_future::cancel() const {
  auto& s = need(state_);
  {
    std::lock_guard lock(s.mutex);
    if (s.ready) return false;
  }
  s.cancel = true;
  if (s.core) return s.batch->cancel();
  std::lock_guard lock(s.inflight_mutex);
  for (const batch_future* f : s.inflight) f->cancel();
  return true;
}
const op_result& op_future::get() const {
  wait();
  return state_->result;
}

void op_future::wait_released() const {
  wait();
  const auto& s = *state_;
  if (!s.core && s.batch) s.batch->wait_released();
}

bool op_future::released() const {
  if (!ready()) return false;
  const auto& s = *state_;
  // A get's rows are no longer touched once it is ready; a put's blocks once its data batch is released.
  return s.core || !s.batch || s.batch->released();
}

}  // namespace gdskit::kv
