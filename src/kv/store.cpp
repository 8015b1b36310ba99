// block_store: opening (options, volumes, recovery), the put and get pipelines through staging memory and
// the batch API, asynchronous operations and their futures, statistics and close.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>

#include <fmt/format.h>

#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"
#include "kv/format.hpp"
#include "kv/shard.hpp"
#include "kv/staging.hpp"
#include "kv/volume.hpp"

namespace gdskit::kv {

using detail::clock;

namespace detail {

/// The shared state of an asynchronous operation (and the control of a running one: its cancel flag and the
/// batches it has in flight, which cancel() stops at once).
struct op_state {
  op_state() {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw error(errno_code(errno), "eventfd", "", -1, 0, "for a block store operation's completion");
    event_fd = fd;
  }
  ~op_state() {
    if (event_fd >= 0) ::close(event_fd);
  }
  op_state(const op_state&) = delete;
  op_state& operator=(const op_state&) = delete;

  void finish(op_result r) {
    {
      std::lock_guard lock(mutex);
      result = std::move(r);
      ready = true;
    }
    const std::uint64_t one = 1;
    // Level-triggered: the counter stays non-zero, nobody reads it.
    [[maybe_unused]] const auto n = ::write(event_fd, &one, sizeof one);
    cv.notify_all();
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
  bool ready = false;
  op_result result;
  int event_fd = -1;
  std::atomic<bool> cancel{false};
  std::mutex inflight_mutex;
  std::vector<const batch_future*> inflight;
  std::function<void()> wake;  // wakes the operation when it waits for staging memory
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

// A range stopped by wait_or_cancel at the deadline (before the batch's own timer fired) timed out; only the
// caller's cancel() makes ECANCELED.
std::error_code range_error(const range_result& r, const detail::op_state* ctl);

std::string holder_names(const std::vector<std::filesystem::path>& paths) {
  std::string out;
  for (const auto& p : paths) out += (out.empty() ? "" : ", ") + detail::printable(p.string());
  return out;
}

std::error_code range_error(const range_result& r, const detail::op_state* ctl) {
  if (r.error == std::errc::operation_canceled && (ctl == nullptr || !ctl->cancel.load())) {
    return errno_code(ETIMEDOUT);
  }
  return r.error;
}

}  // namespace

struct block_store::impl {
  store_options options;
  std::vector<detail::opened_volume> volumes;
  std::vector<std::unique_ptr<detail::shard>> shards;  // by volume index
  std::unique_ptr<detail::staging_pool> staging;
  detail::quarantine held;  // batches past their deadline, with the staging memory and slots they hold
  std::size_t max_batch = 1;
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

  // Asynchronous operations: a queue and up to `max_workers` threads, started as work arrives.
  std::mutex work_mutex;
  std::condition_variable work_cv;
  std::deque<std::function<void()>> work;
  std::vector<std::thread> workers;
  unsigned idle_workers = 0;
  unsigned max_workers = 4;
  bool stopping = false;

  explicit impl(const store_options& o);
  void open();
  detail::shard& shard_for(const key& k) const {
    return *shards[(k.hash() >> 32) % shards.size()];
  }
  void reap() {
    held.reap();
    for (auto& s : shards) s->held().reap();
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
  void check_views(std::span<const key> keys, std::span<const buffer_view> views, bool reads) const;
  op_result run_get(std::span<const key> keys, std::span<const buffer_view> out, clock::time_point deadline,
                    detail::op_state* ctl);
  op_result run_put(std::span<const key> keys, std::span<const buffer_view> blocks, clock::time_point deadline,
                    detail::op_state* ctl);
  /// Queues an asynchronous operation; false once close() has begun.
  bool enqueue(std::function<void()> task);
  void worker_loop();
  void close();
  clock::time_point deadline_of(const op_options& o) const {
    return o.deadline ? *o.deadline : clock::now() + options.deadline;
  }
};

// ---- open ----

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
  if (detail::slots_within(options.block_bytes, per_volume) == 0) {
    const std::uint64_t need = detail::make_layout(options.block_bytes, 1).end_bytes * n;
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

  // Staging: at least four slabs, pinned where a GPU is usable (copies to GPU memory run from it directly).
  std::string gpu_why;
  const bool gpu = gpu_available(&gpu_why);
  const std::size_t want = options.staging_bytes != 0 ? options.staging_bytes : std::size_t{128} << 20;
  const std::size_t slabs = std::clamp<std::size_t>(want / geometry.slot_bytes, 4, 4096);
  staging = std::make_unique<detail::staging_pool>(geometry.slot_bytes, slabs, gpu);
  // Windows of about 4 MiB (at least 16 blocks, at most a quarter of the slabs): a batch has a fixed cost, so
  // small blocks go many to a batch, and a call of many large keys keeps several windows in flight and checks
  // one while the next ones are read; concurrent calls share the slabs.
  max_batch = std::clamp<std::size_t>(std::max<std::size_t>(16, (std::size_t{4} << 20) / geometry.slot_bytes), 1,
                                      std::max<std::size_t>(1, slabs / 4));

  const io_choice& choice = shards.front()->file().choice();
  direct = choice.direct;
  direct_reason = choice.direct_reason;
  if (gpu) {
    path = data_path::staged;
    path_reasons.push_back("blocks are checked (CRC32C) on the host, so GPU memory is reached through pinned staging "
                           "memory");
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

void block_store::impl::check_views(std::span<const key> keys, std::span<const buffer_view> views, bool reads) const {
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

// ---- the pipeline both puts and gets run ----

namespace {

// A window's batch: every block of it in flight at once (a window is already bounded: at most about 4 MiB
// or 16 blocks), by the operation's deadline.
batch_options window_options(clock::time_point deadline, std::size_t ranges) {
  batch_options bo;
  bo.deadline = deadline;
  bo.queue_depth = static_cast<unsigned>(std::max<std::size_t>(1, ranges));
  return bo;
}

// A fresh outcome for `n` keys: nothing decided yet.
op_result undecided(std::size_t n) {
  op_result res;
  res.ok.assign(n, false);
  res.errors.assign(n, errno_code(ENOENT));
  return res;
}

// Moves `count` items through staging memory in windows of at most max_batch, keeping windows in flight
// while slabs last. `start(pos, slabs, w)` takes items from `pos` into window `w` (submitting its batch into
// w.fut, giving back slabs it does not use) and returns the next position; `finish(w)` handles a window once
// its batch ended or the deadline passed; `stop(pos, ec)` decides an item never started (deadline, cancel).
template <class Window, class Start, class Finish, class Stop>
void run_windows(block_store::impl& p, std::size_t count, clock::time_point deadline, detail::op_state* ctl,
                 Start&& start, Finish&& finish, Stop&& stop) {
  auto stopping = [&] { return clock::now() >= deadline || (ctl != nullptr && ctl->cancel.load()); };
  std::deque<Window> inflight;
  std::size_t pos = 0;
  while (pos < count || !inflight.empty()) {
    if (pos < count && stopping()) {
      const std::error_code ec = errno_code(ctl != nullptr && ctl->cancel.load() ? ECANCELED : ETIMEDOUT);
      for (; pos < count; ++pos) stop(pos, ec);
    }
    while (pos < count && !stopping()) {
      auto slabs = p.staging->take(std::min(count - pos, p.max_batch), deadline, inflight.empty(),
                                   ctl != nullptr ? &ctl->cancel : nullptr);
      if (slabs.empty()) break;
      Window w;
      pos = start(pos, slabs, w);
      if (!w.fut.valid()) continue;
      inflight.push_back(std::move(w));
      if (ctl != nullptr) ctl->track(&inflight.back().fut);
    }
    if (inflight.empty()) continue;
    Window& w = inflight.front();
    detail::wait_or_cancel(w.fut, deadline);
    if (ctl != nullptr) ctl->untrack(&w.fut);
    finish(w);
    inflight.pop_front();
  }
}

}  // namespace

// ---- get ----

op_result block_store::impl::run_get(std::span<const key> keys, std::span<const buffer_view> out,
                                     clock::time_point deadline, detail::op_state* ctl) {
  const auto t0 = clock::now();
  const std::size_t n = keys.size();
  op_result res = undecided(n);
  reap();
  gets += n;

  struct pending {
    std::size_t i;
    detail::shard* sh;
    detail::read_ticket t;
  };
  std::vector<pending> todo;
  todo.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    detail::shard& sh = shard_for(keys[i]);
    if (auto t = sh.begin_read(keys[i])) todo.push_back({i, &sh, *t});
  }
  const std::size_t io_bytes = shards.front()->geometry().slot_bytes;
  const std::size_t header_at = shards.front()->geometry().header_offset;
  const std::size_t block_bytes = options.block_bytes;

  auto fail = [&](const pending& p, std::error_code ec, detail::shard::read_outcome o) {
    res.errors[p.i] = ec;
    p.sh->end_read(keys[p.i], p.t, o);
    count_error(ec, false);
  };
  auto check_and_copy = [&](const pending& p, const std::uint8_t* slab, const range_result& rr) {
    bytes_read += rr.nbytes;
    if (!rr.ok()) return fail(p, range_error(rr, ctl), detail::shard::read_outcome::other);
    detail::block_header h;
    const bool good = rr.nbytes == io_bytes && detail::decode_header(slab + header_at, h) && h.uuid == p.sh->uuid() &&
                      h.namespace_hash == p.sh->namespace_hash() && h.volume == p.sh->volume() && h.slot == p.t.slot &&
                      h.sequence == p.t.sequence && h.data_crc == p.t.data_crc && h.k == keys[p.i] &&
                      h.data_bytes == block_bytes && crc32c(slab, block_bytes) == h.data_crc;
    if (!good) return fail(p, errno_code(EBADMSG), detail::shard::read_outcome::bad);
    try {
      if (host_memory(out[p.i])) {
        std::memcpy(out[p.i].data, slab, block_bytes);
      } else {
        copy_into(out[p.i], 0, slab, block_bytes);
      }
    } catch (const std::system_error& e) {
      return fail(p, e.code().category() == std::generic_category() ? e.code() : errno_code(EIO),
                  detail::shard::read_outcome::other);
    }
    res.ok[p.i] = true;
    res.errors[p.i] = {};
    p.sh->end_read(keys[p.i], p.t, detail::shard::read_outcome::hit);
  };

  struct window {
    std::vector<pending> items;
    std::vector<std::uint8_t*> slabs;
    batch_future fut;
  };
  auto start = [&](std::size_t pos, std::vector<std::uint8_t*>& slabs, window& w) {
    w.slabs = std::move(slabs);
    std::vector<io_range> ranges;
    for (std::size_t j = 0; j < w.slabs.size(); ++j) {
      const pending& p = todo[pos++];
      w.items.push_back(p);
      ranges.push_back({&p.sh->file(), p.sh->geometry().slot_position(p.t.slot), staging->view(w.slabs[j], io_bytes)});
    }
    const batch_options bo = window_options(deadline, ranges.size());
    try {
      w.fut = submit_reads(ranges, bo);
    } catch (const std::system_error& e) {
      for (const auto& p : w.items) fail(p, e.code(), detail::shard::read_outcome::other);
      staging->give(w.slabs);
    }
    return pos;
  };
  auto finish = [&](window& w) {
    const batch_result& r = w.fut.get();
    for (std::size_t j = 0; j < w.items.size(); ++j) check_and_copy(w.items[j], w.slabs[j], r.ranges[j]);
    if (detail::settled(w.fut)) {
      staging->give(w.slabs);
    } else {
      held.add(std::move(w.fut), [this, slabs = std::move(w.slabs)] { staging->give(slabs); });
    }
  };
  run_windows<window>(*this, todo.size(), deadline, ctl, start, finish, [&](std::size_t pos, std::error_code ec) {
    fail(todo[pos], ec, detail::shard::read_outcome::other);
  });
  for (bool b : res.ok) res.ok_count += b ? 1 : 0;
  hits += res.ok_count;
  misses += n - res.ok_count;
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

// ---- put ----

op_result block_store::impl::run_put(std::span<const key> keys, std::span<const buffer_view> blocks,
                                     clock::time_point deadline, detail::op_state* ctl) {
  const auto t0 = clock::now();
  const std::size_t n = keys.size();
  op_result res = undecided(n);
  reap();
  puts += n;
  const detail::layout& g = shards.front()->geometry();
  const std::size_t block_bytes = options.block_bytes;
  const bool persist = options.mode == durability::persist;
  // cache: data and header in one request per block. persist: the data, fdatasync, the headers, fdatasync.
  const std::size_t first_bytes = persist ? g.header_offset : g.slot_bytes;

  struct item {
    std::size_t i;
    detail::shard* sh;
    std::uint32_t slot;
    std::uint32_t crc;
    std::uint8_t* slab;
  };
  // What a window's batches hold: given back when the last of them is released.
  struct holding {
    block_store::impl* owner = nullptr;
    std::vector<std::uint8_t*> slabs;
    std::vector<std::pair<detail::shard*, std::uint32_t>> slots;
    ~holding() {
      owner->staging->give(slabs);
      for (auto [sh, s] : slots) sh->release_slot(s);
    }
  };
  struct window {
    std::vector<item> items;
    std::vector<std::uint8_t*> slabs;
    batch_future fut;
  };

  auto decide = [&](std::size_t i, std::error_code ec) {
    res.errors[i] = ec;
    if (ec) count_error(ec, true);
  };
  // Fills a slab: the block (copied, so the caller's memory is free at once and what is checksummed is what is
  // written), zero padding to the header page, and the header.
  auto fill = [&](const item& it, std::uint64_t seq) -> std::uint32_t {
    if (host_memory(blocks[it.i])) {
      std::memcpy(it.slab, blocks[it.i].data, block_bytes);
    } else {
      copy_out(blocks[it.i], 0, it.slab, block_bytes);
    }
    std::memset(it.slab + block_bytes, 0, g.slot_bytes - block_bytes);
    const std::uint32_t crc = crc32c(it.slab, block_bytes);
    detail::block_header h;
    h.uuid = it.sh->uuid();
    h.namespace_hash = it.sh->namespace_hash();
    h.sequence = seq;
    h.volume = it.sh->volume();
    h.slot = it.slot;
    h.data_bytes = block_bytes;
    h.data_crc = crc;
    h.k = keys[it.i];
    detail::encode_header(h, it.slab + g.header_offset);
    return crc;
  };

  auto start = [&](std::size_t pos, std::vector<std::uint8_t*>& slabs, window& w) {
    std::vector<io_range> ranges;
    std::size_t used = 0;
    while (pos < n && used < slabs.size() && clock::now() < deadline && (ctl == nullptr || !ctl->cancel.load())) {
      const std::size_t i = pos++;
      detail::shard& sh = shard_for(keys[i]);
      const std::uint64_t seq = next_sequence.fetch_add(1);
      std::uint32_t slot = 0;
      std::error_code ec;
      switch (sh.begin_write(keys[i], seq, next_sequence.load(), deadline, slot, ec)) {
        case detail::write_claim::present:
          res.ok[i] = true;
          res.errors[i] = {};
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
      item it{i, &sh, slot, 0, slabs[used]};
      try {
        it.crc = fill(it, seq);
      } catch (const std::system_error& e) {
        sh.abandon(slot, false);
        decide(i, e.code().category() == std::generic_category() ? e.code() : errno_code(EIO));
        continue;
      }
      ++used;
      ranges.push_back({&sh.file(), g.slot_position(slot), staging->view(it.slab, first_bytes)});
      w.items.push_back(it);
    }
    w.slabs.assign(slabs.begin(), slabs.begin() + static_cast<std::ptrdiff_t>(used));
    staging->give(std::vector<std::uint8_t*>(slabs.begin() + static_cast<std::ptrdiff_t>(used), slabs.end()));
    if (w.items.empty()) return pos;
    const batch_options bo = window_options(deadline, ranges.size());
    try {
      w.fut = submit_writes(ranges, bo);
    } catch (const std::system_error& e) {
      for (const auto& it : w.items) {
        it.sh->abandon(it.slot, false);
        decide(it.i, e.code());
      }
      staging->give(w.slabs);
    }
    return pos;
  };

  auto finish = [&](window& w) {
    std::vector<std::error_code> outcome(w.items.size());
    std::vector<batch_future> unreleased;
    // Records a batch's outcome for the items `which` lists (its ranges in order).
    auto record = [&](batch_future& f, const std::vector<std::size_t>& which) {
      const batch_result& r = f.get();
      for (std::size_t k = 0; k < which.size(); ++k) {
        outcome[which[k]] = range_error(r.ranges[k], ctl);
        if (r.ranges[k].ok()) bytes_written += r.ranges[k].nbytes;
      }
      if (!detail::settled(f)) unreleased.push_back(std::move(f));
    };
    // fdatasync of every volume an item that is still fine was written to; a failed sync fails its items.
    auto sync_fine = [&] {
      std::vector<const detail::shard*> touched;
      for (std::size_t j = 0; j < w.items.size(); ++j) {
        if (!outcome[j]) touched.push_back(w.items[j].sh);
      }
      std::sort(touched.begin(), touched.end());
      touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
      for (const detail::shard* sh : touched) {
        const std::error_code ec = detail::sync_until(sh->file_ptr(), deadline);
        for (std::size_t j = 0; j < w.items.size() && ec; ++j) {
          if (!outcome[j] && w.items[j].sh == sh) outcome[j] = ec;
        }
      }
    };
    std::vector<std::size_t> all(w.items.size());
    for (std::size_t j = 0; j < all.size(); ++j) all[j] = j;
    record(w.fut, all);

    if (persist) {
      // Data first and synced, then the headers and synced: a header on disk always describes data on disk.
      sync_fine();
      std::vector<io_range> heads;
      std::vector<std::size_t> which;
      for (std::size_t j = 0; j < w.items.size(); ++j) {
        if (outcome[j]) continue;
        const item& it = w.items[j];
        heads.push_back({&it.sh->file(), g.header_position(it.slot),
                         staging->view(it.slab + g.header_offset, detail::page_bytes)});
        which.push_back(j);
      }
      if (!heads.empty()) {
        const batch_options bo = window_options(deadline, heads.size());
        try {
          batch_future hf = submit_writes(heads, bo);
          if (ctl != nullptr) ctl->track(&hf);
          detail::wait_or_cancel(hf, deadline);
          if (ctl != nullptr) ctl->untrack(&hf);
          record(hf, which);
        } catch (const std::system_error& e) {
          for (std::size_t k : which) outcome[k] = e.code();
        }
        sync_fine();
      }
    }

    auto keep = unreleased.empty() ? nullptr : std::make_shared<holding>();
    for (std::size_t j = 0; j < w.items.size(); ++j) {
      const item& it = w.items[j];
      if (!outcome[j]) {
        it.sh->publish(it.slot, it.crc);
        res.ok[it.i] = true;
        res.errors[it.i] = {};
        ++stored;
      } else {
        it.sh->abandon(it.slot, keep != nullptr);
        if (keep) keep->slots.emplace_back(it.sh, it.slot);
        decide(it.i, outcome[j]);
      }
    }
    if (keep) {
      keep->owner = this;
      keep->slabs = std::move(w.slabs);
      for (auto& f : unreleased) held.add(std::move(f), [keep] {});
    } else {
      staging->give(w.slabs);
    }
  };
  run_windows<window>(*this, n, deadline, ctl, start, finish, [&](std::size_t pos, std::error_code ec) { decide(pos, ec); });
  for (bool b : res.ok) res.ok_count += b ? 1 : 0;
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
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

  std::unique_lock exclusive(gate);
  if (closed) return;
  closed = true;
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

}  // namespace

#define GDSKIT_KV_SHARED_GATE(p)                \
  std::shared_lock gate_lock((p).gate);         \
  if ((p).closed) bad(EBADF, "the store is closed")

op_result block_store::put(std::span<const key> keys, std::span<const buffer_view> blocks, const op_options& options) {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, blocks, false);
  return p.run_put(keys, blocks, p.deadline_of(options), nullptr);
}

op_result block_store::get(std::span<const key> keys, std::span<const buffer_view> out, const op_options& options) {
  impl& p = open_impl(impl_);
  GDSKIT_KV_SHARED_GATE(p);
  p.check_views(keys, out, true);
  return p.run_get(keys, out, p.deadline_of(options), nullptr);
}

namespace {

op_future submit_op(const std::shared_ptr<block_store::impl>& ptr, std::span<const key> keys,
                    std::span<const buffer_view> views, const op_options& options, bool reads) {
  block_store::impl& p = open_impl(ptr);
  {
    GDSKIT_KV_SHARED_GATE(p);
    p.check_views(keys, views, reads);
  }
  auto state = std::make_shared<detail::op_state>();
  const clock::time_point deadline = p.deadline_of(options);
  auto* staging = p.staging.get();
  state->wake = [staging] { staging->wake(); };
  std::vector<key> k(keys.begin(), keys.end());
  std::vector<buffer_view> v(views.begin(), views.end());
  const std::size_t n = k.size();
  const bool queued = p.enqueue([&p, state, k = std::move(k), v = std::move(v), deadline, reads] {
    op_result r;
    try {
      std::shared_lock gate_lock(p.gate);
      if (p.closed) {
        r.ok.assign(k.size(), false);
        r.errors.assign(k.size(), errno_code(EBADF));
      } else {
        r = reads ? p.run_get(k, v, deadline, state.get()) : p.run_put(k, v, deadline, state.get());
      }
    } catch (const std::system_error& e) {
      r.ok.assign(k.size(), false);
      r.errors.assign(k.size(), e.code());
    } catch (const std::bad_alloc&) {
      r.ok.assign(k.size(), false);
      r.errors.assign(k.size(), errno_code(ENOMEM));
    }
    state->finish(std::move(r));
  });
  if (!queued) {
    op_result r;
    r.ok.assign(n, false);
    r.errors.assign(n, errno_code(EBADF));
    state->finish(std::move(r));
  }
  return op_future(std::move(state));
}

}  // namespace

op_future block_store::submit_put(std::span<const key> keys, std::span<const buffer_view> blocks,
                                  const op_options& options) {
  return submit_op(impl_, keys, blocks, options, false);
}

op_future block_store::submit_get(std::span<const key> keys, std::span<const buffer_view> out,
                                  const op_options& options) {
  return submit_op(impl_, keys, out, options, true);
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
  return s.ready;
}
void op_future::wait() const {
  auto& s = need(state_);
  std::unique_lock lock(s.mutex);
  s.cv.wait(lock, [&] { return s.ready; });
}
bool op_future::wait_for(std::chrono::nanoseconds timeout) const {
  auto& s = need(state_);
  std::unique_lock lock(s.mutex);
  return s.cv.wait_for(lock, timeout, [&] { return s.ready; });
}
int op_future::fd() const { return need(state_).event_fd; }
bool op_future::cancel() const {
  auto& s = need(state_);
  {
    std::lock_guard lock(s.mutex);
    if (s.ready) return false;
  }
  s.cancel = true;
  {
    std::lock_guard lock(s.inflight_mutex);
    for (const batch_future* f : s.inflight) f->cancel();
  }
  if (s.wake) s.wake();
  return true;
}
const op_result& op_future::get() const {
  wait();
  return state_->result;
}
bool op_future::released() const { return ready(); }

}  // namespace gdskit::kv
