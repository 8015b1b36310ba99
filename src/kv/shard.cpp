#include "kv/shard.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gdskit/error.hpp"

namespace gdskit::kv::detail {

// ---- helpers ----

bool wait_or_cancel(const batch_future& f, clock::time_point deadline) {
  if (f.wait_for(deadline - clock::now())) return true;
  f.cancel();
  return false;
}

bool settled(const batch_future& f) {
  for (const range_result& r : f.get().ranges) {
    if (r.error == std::errc::timed_out || r.error == std::errc::operation_canceled) return f.released();
  }
  f.wait_released();
  return true;
}

std::error_code sync_until(const std::shared_ptr<const file_handle>& file, clock::time_point deadline) {
  struct shared {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::error_code ec;
  };
  auto st = std::make_shared<shared>();
  auto run = [st, file] {
    std::error_code ec;
    try {
      file->sync();
    } catch (const std::system_error& e) {
      ec = e.code();
    }
    std::lock_guard lock(st->m);
    st->done = true;
    st->ec = ec;
    st->cv.notify_all();
  };
  try {
    std::thread(run).detach();
  } catch (const std::system_error&) {
    run();  // no thread to be had: sync here
  }
  std::unique_lock lock(st->m);
  if (!st->cv.wait_until(lock, deadline, [&] { return st->done; })) return errno_code(ETIMEDOUT);
  return st->ec;
}

void quarantine::add(std::shared_ptr<const batch_future> f, std::function<void()> on_release) {
  try {
    std::lock_guard lock(mutex_);
    entries_.push_back({f, on_release});
  } catch (const std::bad_alloc&) {
    // No room to keep it: wait here until nothing of the batch still targets what `on_release` holds.
    f->wait_released();
    on_release();
  }
}

void quarantine::reap() {
  std::vector<entry> done;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < entries_.size();) {
      if (entries_[i].future->released()) {
        done.push_back(std::move(entries_[i]));
        entries_[i] = std::move(entries_.back());
        entries_.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& e : done) {
    if (e.on_release) e.on_release();
  }
}

bool quarantine::drain(std::chrono::nanoseconds limit) {
  const auto until = clock::now() + limit;
  for (;;) {
    reap();
    if (size() == 0) return true;
    if (clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::size_t quarantine::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

namespace {

struct aligned_free {
  void operator()(void* p) const noexcept { std::free(p); }
};
using aligned_bytes = std::unique_ptr<std::uint8_t[], aligned_free>;

aligned_bytes aligned_zeroed(std::size_t n) {
  void* p = std::aligned_alloc(page_bytes, round_up(std::max<std::size_t>(n, 1), page_bytes));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return aligned_bytes(static_cast<std::uint8_t*>(p));
}

}  // namespace

void shard::hash_ring::add(std::uint64_t h) {
  if (limit == 0) return;
  order.push_back(h);
  ++count[h];
  while (order.size() > limit) {
    const std::uint64_t old = order.front();
    order.pop_front();
    auto it = count.find(old);
    if (it != count.end() && --it->second == 0) count.erase(it);
  }
}

void shard::hash_ring::erase(std::uint64_t h) { count.erase(h); }

// ---- shard ----

shard::shard(shard_open o)
    : file_(std::move(o.file)),
      headers_(o.headers ? std::move(o.headers) : file_),
      geometry_(o.geometry),
      uuid_(o.uuid),
      volume_(o.volume),
      namespace_hash_(o.namespace_hash),
      mode_(o.mode),
      admit_(o.admit),
      block_device_(o.block_device),
      data_path_(std::move(o.data_path)),
      slots_(geometry_.slots) {
  const std::size_t n = geometry_.slots;
  small_target_ = std::max<std::size_t>(1, n / 10);
  // A sixteenth of the slots per window: checkpoints cost about 52 bytes per slot per window, and a rebuild
  // after a crash reads the headers of one window.
  window_target_ = std::max<std::size_t>(std::min<std::size_t>(n, 8), n / 16);
  ghost_.limit = n;
  seen_.limit = n;
}

void shard::queue_push_head(std::uint32_t s, std::uint8_t q) {
  fifo& f = q == 1 ? small_ : main_;
  slot_meta& m = slots_[s];
  m.queue = q;
  m.prev = -1;
  m.next = f.head;
  if (f.head >= 0) slots_[f.head].prev = static_cast<std::int32_t>(s);
  f.head = static_cast<std::int32_t>(s);
  if (f.tail < 0) f.tail = static_cast<std::int32_t>(s);
  ++f.size;
}

void shard::queue_remove(std::uint32_t s) {
  slot_meta& m = slots_[s];
  if (m.queue == 0) return;
  fifo& f = m.queue == 1 ? small_ : main_;
  if (m.prev >= 0) slots_[m.prev].next = m.next; else f.head = m.next;
  if (m.next >= 0) slots_[m.next].prev = m.prev; else f.tail = m.prev;
  m.prev = m.next = -1;
  m.queue = 0;
  --f.size;
}

// S3-FIFO: new blocks enter a small FIFO (a tenth of the slots); one that was read while there moves to the
// main FIFO when it reaches the tail, one that was not is evicted and its key remembered in the ghost FIFO (a
// key put again while remembered goes straight to main). Main is a FIFO with reinsertion: a block read since
// it last passed the tail goes round again with one access fewer. One scan of blocks read once therefore flows
// through the small queue without displacing the blocks read again. Pinned blocks go round without losing
// anything.
std::optional<std::uint32_t> shard::choose_victim() {
  std::size_t guard = 4 * (small_.size + main_.size) + 4;
  while (guard-- > 0) {
    if (small_.size > 0 && (small_.size >= small_target_ || main_.size == 0)) {
      const auto s = static_cast<std::uint32_t>(small_.tail);
      queue_remove(s);
      slot_meta& m = slots_[s];
      if (m.pins > 0 || m.freq > 0) {
        m.freq = 0;
        queue_push_head(s, 2);
        continue;
      }
      ghost_add(m.k.hash());
      return s;
    }
    if (main_.size == 0) return std::nullopt;
    const auto s = static_cast<std::uint32_t>(main_.tail);
    queue_remove(s);
    slot_meta& m = slots_[s];
    if (m.pins > 0 || m.freq > 0) {
      if (m.pins == 0) --m.freq;
      queue_push_head(s, 2);
      continue;
    }
    return s;
  }
  return std::nullopt;
}

bool shard::ghost_contains(std::uint64_t h) const { return ghost_.contains(h); }
void shard::ghost_add(std::uint64_t h) { ghost_.add(h); }

void shard::forget(std::uint32_t s) {
  slot_meta& m = slots_[s];
  auto it = map_.find(m.k);
  if (it != map_.end() && it->second == s) map_.erase(it);
  queue_remove(s);
  if (m.state == slot_state::valid || m.state == slot_state::doomed) --blocks_;
  if (m.pins > 0) {
    m.pins = 0;
    --pinned_;
  }
}

std::optional<std::uint32_t> shard::take_from_window() {
  auto usable = [&](std::uint32_t s) {
    const slot_meta& m = slots_[s];
    return m.state == slot_state::free || (m.state == slot_state::doomed && m.readers == 0 && m.pins == 0);
  };
  while (window_next_ < window_.size()) {
    const std::uint32_t s = window_[window_next_++];
    if (usable(s)) return s;
    if (slots_[s].state == slot_state::doomed) deferred_.push_back(s);  // being read: its turn comes later
  }
  for (std::size_t i = 0; i < deferred_.size();) {
    const std::uint32_t s = deferred_[i];
    if (usable(s)) {
      deferred_[i] = deferred_.back();
      deferred_.pop_back();
      return s;
    }
    if (slots_[s].state != slot_state::doomed) {  // read since, and kept: no longer a candidate
      deferred_[i] = deferred_.back();
      deferred_.pop_back();
    } else {
      ++i;
    }
  }
  return std::nullopt;
}

bool shard::contains(const key& k) const {
  std::lock_guard lock(mutex_);
  auto it = map_.find(k);
  if (it == map_.end()) return false;
  const slot_state st = slots_[it->second].state;
  return st == slot_state::valid || st == slot_state::doomed;
}

std::optional<read_ticket> shard::begin_read(const key& k) {
  std::lock_guard lock(mutex_);
  auto it = map_.find(k);
  if (it == map_.end()) return std::nullopt;
  slot_meta& m = slots_[it->second];
  if (m.state != slot_state::valid && m.state != slot_state::doomed) return std::nullopt;
  ++m.readers;
  return read_ticket{it->second, m.sequence, m.data_crc};
}

void shard::end_read(const key& k, const read_ticket& t, read_outcome outcome) {
  std::lock_guard lock(mutex_);
  slot_meta& m = slots_[t.slot];
  if (m.readers > 0) --m.readers;
  const bool same = (m.state == slot_state::valid || m.state == slot_state::doomed) && m.sequence == t.sequence &&
                    m.k == k;
  if (same && outcome == read_outcome::hit) {
    if (m.freq < 3) ++m.freq;
    if (m.state == slot_state::doomed) {  // read after it was chosen for eviction: kept after all
      m.state = slot_state::valid;
      queue_push_head(t.slot, 2);
    }
  } else if (same && outcome == read_outcome::bad) {
    forget(t.slot);
    m.k = {};
    m.state = slot_state::dropping;
  }
  if (m.state == slot_state::dropping && m.readers == 0) {
    m.state = slot_state::free;
    free_.push_back(t.slot);
  }
}

write_claim shard::begin_write(const key& k, std::uint64_t seq, std::uint64_t next_sequence,
                               clock::time_point deadline, std::uint32_t& slot, std::error_code& ec) {
  // A checkpoint that found the window refilled by another thread returns at once; a third try without a
  // slot means there is none (every block pinned or being read).
  for (int attempt = 0;; ++attempt) {
    {
      std::lock_guard lock(mutex_);
      auto it = map_.find(k);
      if (it != map_.end()) {
        slot_meta& m = slots_[it->second];
        if (m.state == slot_state::doomed) {  // put again while chosen for eviction: kept after all
          m.state = slot_state::valid;
          queue_push_head(it->second, 2);
        }
        return write_claim::present;
      }
      if (admit_ == admission::second_hit && attempt == 0) {
        const std::uint64_t h = k.hash();
        if (!seen_.contains(h) && !ghost_contains(h)) {
          seen_.add(h);
          return write_claim::not_admitted;
        }
      }
      if (auto s = take_from_window()) {
        slot_meta& m = slots_[*s];
        if (m.state == slot_state::doomed) {
          forget(*s);
          ++evictions_;
        }
        m.k = k;
        m.sequence = seq;
        m.data_crc = 0;
        m.freq = 0;
        m.state = slot_state::writing;
        busy_.insert(*s);
        map_[k] = *s;
        slot = *s;
        return write_claim::write;
      }
      if (attempt >= 2) {
        ec = errno_code(ENOSPC);
        return write_claim::no_space;
      }
    }
    ec = checkpoint(next_sequence, deadline, false);
    if (ec) return write_claim::failed;
  }
}

void shard::publish(std::uint32_t s, std::uint32_t data_crc) {
  std::lock_guard lock(mutex_);
  slot_meta& m = slots_[s];
  m.state = slot_state::valid;
  m.data_crc = data_crc;
  m.freq = 0;
  busy_.erase(s);
  ++blocks_;
  const std::uint64_t h = m.k.hash();
  if (ghost_contains(h)) {
    ghost_.erase(h);
    queue_push_head(s, 2);
  } else {
    queue_push_head(s, 1);
  }
}

void shard::abandon(std::uint32_t s, bool still_in_flight) {
  std::lock_guard lock(mutex_);
  slot_meta& m = slots_[s];
  auto it = map_.find(m.k);
  if (it != map_.end() && it->second == s) map_.erase(it);
  m.k = {};
  if (still_in_flight) {
    m.state = slot_state::quarantined;
  } else {
    m.state = slot_state::free;
    busy_.erase(s);
    free_.push_back(s);
  }
}

void shard::release_slot(std::uint32_t s) {
  std::lock_guard lock(mutex_);
  slot_meta& m = slots_[s];
  if (m.state != slot_state::quarantined) return;
  m.state = slot_state::free;
  busy_.erase(s);
  free_.push_back(s);
}

bool shard::pin(const key& k) {
  std::lock_guard lock(mutex_);
  auto it = map_.find(k);
  if (it == map_.end()) return false;
  slot_meta& m = slots_[it->second];
  if (m.state == slot_state::doomed) {
    m.state = slot_state::valid;
    queue_push_head(it->second, 2);
  }
  if (m.state != slot_state::valid) return false;
  if (m.pins++ == 0) ++pinned_;
  return true;
}

void shard::unpin(const key& k) {
  std::lock_guard lock(mutex_);
  auto it = map_.find(k);
  if (it == map_.end()) return;
  slot_meta& m = slots_[it->second];
  if (m.pins > 0 && --m.pins == 0) --pinned_;
}

shard::counts shard::count() const {
  std::lock_guard lock(mutex_);
  return {blocks_, pinned_, evictions_, checkpoints_, checkpoint_bytes_};
}

std::uint64_t shard::physical_bytes() const {
  if (block_device_) return geometry_.end_bytes;
  struct stat st {};
  if (::stat(data_path_.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

// ---- checkpoints ----

std::error_code shard::checkpoint(std::uint64_t next_sequence, clock::time_point deadline, bool closing) {
  std::lock_guard serial(checkpoint_mutex_);
  std::vector<std::uint32_t> window;      // what the checkpoint lists
  std::vector<std::uint32_t> usable;      // the part of it writes may take
  std::vector<std::uint32_t> from_free, newly_doomed;
  aligned_bytes buf;
  std::size_t io_bytes = 0;
  std::uint64_t gen = 0;
  {
    std::lock_guard lock(mutex_);
    if (!closing) {
      // Another thread may have refilled the window while this one waited for the checkpoint lock.
      auto usable_now = [&](std::uint32_t s) {
        const slot_meta& m = slots_[s];
        return m.state == slot_state::free || (m.state == slot_state::doomed && m.readers == 0 && m.pins == 0);
      };
      for (std::size_t i = window_next_; i < window_.size(); ++i) {
        if (usable_now(window_[i])) return {};
      }
      for (std::uint32_t s : deferred_) {
        if (usable_now(s)) return {};
      }
      if (checkpoint_stuck_) return errno_code(ETIMEDOUT);  // the last one is still in the kernel
    }
    window.assign(busy_.begin(), busy_.end());
    if (!closing) {
      for (std::uint32_t s : deferred_) {
        if (slots_[s].state == slot_state::doomed) usable.push_back(s);
      }
      for (std::size_t i = window_next_; i < window_.size(); ++i) {
        const slot_meta& m = slots_[window_[i]];
        if (m.state == slot_state::free || m.state == slot_state::doomed) usable.push_back(window_[i]);
      }
      while (usable.size() < window_target_ && !free_.empty()) {
        const std::uint32_t s = free_.back();
        free_.pop_back();
        if (slots_[s].state != slot_state::free) continue;  // listed twice
        from_free.push_back(s);
        usable.push_back(s);
      }
      while (usable.size() < window_target_) {
        auto v = choose_victim();
        if (!v) break;
        slots_[*v].state = slot_state::doomed;
        newly_doomed.push_back(*v);
        usable.push_back(*v);
      }
      window.insert(window.end(), usable.begin(), usable.end());
    }
    const std::size_t entries = geometry_.slots * checkpoint_entry_bytes;
    const std::size_t body = entries + window.size() * window_entry_bytes;
    io_bytes = page_bytes + round_up(body, page_bytes);
    buf = aligned_zeroed(io_bytes);
    std::uint8_t* b = buf.get() + page_bytes;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const slot_meta& m = slots_[s];
      if (m.state == slot_state::valid || m.state == slot_state::doomed) {
        encode_entry({m.data_crc, m.sequence, m.k}, b + s * checkpoint_entry_bytes);
      }
    }
    for (std::size_t i = 0; i < window.size(); ++i) {
      const std::uint32_t s = window[i];
      for (int j = 0; j < 4; ++j) b[entries + 4 * i + j] = static_cast<std::uint8_t>(s >> (8 * j));
    }
    gen = generation_ + 1;
    checkpoint_header h;
    h.uuid = uuid_;
    h.generation = gen;
    h.next_sequence = next_sequence;
    h.slots = geometry_.slots;
    h.window_count = window.size();
    h.body_bytes = body;
    h.body_crc = crc32c(b, body);
    h.clean = window.empty();
    h.namespace_hash = namespace_hash_;
    encode_checkpoint_header(h, buf.get());
  }

  std::error_code ec;
  {
    std::shared_ptr<std::uint8_t[]> keep(buf.release(), aligned_free{});
    const io_range r{file_.get(), geometry_.checkpoint_position(static_cast<unsigned>(gen % 2)),
                     buffer_view::host(keep.get(), io_bytes)};
    batch_options bo;
    bo.deadline = deadline;
    try {
      auto f = std::make_shared<const batch_future>(submit_writes(std::span<const io_range>(&r, 1), bo));
      wait_or_cancel(*f, deadline);
      ec = f->get().ranges[0].error;
      if (ec == std::errc::operation_canceled) ec = errno_code(ETIMEDOUT);  // stopped at the deadline
      if (!settled(*f)) {
        std::lock_guard lock(mutex_);
        checkpoint_stuck_ = true;
        quarantine_.add(std::move(f), [this, keep] {
          std::lock_guard l(mutex_);
          checkpoint_stuck_ = false;
        });
      }
    } catch (const std::system_error& e) {
      ec = e.code();
    }
  }
  if (!ec && mode_ == durability::persist) ec = sync_until(file_, deadline);

  std::lock_guard lock(mutex_);
  if (ec) {
    // Nothing of the new window may be written: what it took goes back where it came from.
    for (std::uint32_t s : newly_doomed) {
      if (slots_[s].state == slot_state::doomed) {
        slots_[s].state = slot_state::valid;
        queue_push_head(s, 2);
      }
    }
    free_.insert(free_.end(), from_free.begin(), from_free.end());
    return ec;
  }
  generation_ = gen;
  window_ = std::move(usable);
  window_next_ = 0;
  deferred_.clear();
  ++checkpoints_;
  checkpoint_bytes_ += io_bytes;
  return {};
}

void shard::final_checkpoint(std::uint64_t next_sequence, clock::time_point deadline) {
  const std::error_code ec = checkpoint(next_sequence, deadline, true);
  if (ec) {
    throw error(ec, "write index checkpoint", data_path_.string(), static_cast<std::int64_t>(geometry_.checkpoint_offset),
                geometry_.checkpoint_bytes, "the next open reads every block header instead");
  }
}

// ---- recovery ----

std::uint64_t shard::recover(bool created, bool ignore_checkpoint, recovery_info& info) {
  std::lock_guard lock(mutex_);
  std::uint64_t next_sequence = 1;
  std::vector<std::uint32_t> rescan;
  bool from_checkpoint = false;
  if (!created) {
    // The newest checkpoint copy whose header and body check out.
    struct candidate {
      checkpoint_header h;
      unsigned copy;
    };
    std::vector<candidate> found;
    for (unsigned copy = 0; copy < 2; ++copy) {
      std::uint8_t page[page_bytes];
      std::size_t got = 0;
      try {
        got = file_->pread(page, page_bytes, geometry_.checkpoint_position(copy));
      } catch (const std::system_error&) {
        got = 0;  // unreadable: as if absent
      }
      info.bytes_read += got;
      checkpoint_header h;
      if (got == page_bytes && decode_checkpoint_header(page, h) && h.uuid == uuid_ && h.slots == geometry_.slots &&
          h.namespace_hash == namespace_hash_) {
        found.push_back({h, copy});
      }
    }
    std::sort(found.begin(), found.end(), [](const candidate& a, const candidate& b) {
      return a.h.generation > b.h.generation;
    });
    for (const candidate& c : found) {
      if (ignore_checkpoint) break;
      aligned_bytes body = aligned_zeroed(c.h.body_bytes);
      std::size_t got = 0;
      try {
        got = file_->pread(body.get(), c.h.body_bytes, geometry_.checkpoint_position(c.copy) + page_bytes);
      } catch (const std::system_error&) {
        got = 0;
      }
      info.bytes_read += got;
      if (got != c.h.body_bytes || crc32c(body.get(), c.h.body_bytes) != c.h.body_crc) continue;
      std::vector<checkpoint_entry> entries(geometry_.slots);
      bool good = true;
      for (std::size_t s = 0; s < geometry_.slots && good; ++s) {
        good = decode_entry(body.get() + s * checkpoint_entry_bytes, entries[s]);
      }
      const std::uint8_t* w = body.get() + geometry_.slots * checkpoint_entry_bytes;
      std::vector<std::uint32_t> window(c.h.window_count);
      for (std::size_t i = 0; i < window.size() && good; ++i) {
        std::uint32_t s = 0;
        for (int j = 3; j >= 0; --j) s = (s << 8) | w[4 * i + j];
        good = s < geometry_.slots;
        window[i] = s;
      }
      if (!good) continue;
      for (std::size_t s = 0; s < geometry_.slots; ++s) {
        if (entries[s].k.type() == key::kind::none) continue;
        slot_meta& m = slots_[s];
        m.k = entries[s].k;
        m.sequence = entries[s].sequence;
        m.data_crc = entries[s].data_crc;
        m.state = slot_state::valid;
      }
      for (std::uint32_t s : window) slots_[s] = slot_meta{};  // written since, perhaps: read their headers
      rescan = std::move(window);
      std::sort(rescan.begin(), rescan.end());
      rescan.erase(std::unique(rescan.begin(), rescan.end()), rescan.end());
      next_sequence = c.h.next_sequence;
      generation_ = c.h.generation;
      from_checkpoint = true;
      info.clean = info.clean && c.h.clean && rescan.empty();
      break;
    }
    if (!from_checkpoint) {
      generation_ = found.empty() ? 0 : found.front().h.generation;
      rescan.resize(geometry_.slots);
      for (std::uint32_t s = 0; s < geometry_.slots; ++s) rescan[s] = s;
    }

    // Read the headers of the slots to rescan, many at a time.
    const std::size_t per_batch = std::min<std::size_t>(1024, rescan.size());
    aligned_bytes pages = per_batch == 0 ? aligned_bytes() : aligned_zeroed(per_batch * page_bytes);
    for (std::size_t first = 0; first < rescan.size(); first += per_batch) {
      const std::size_t n = std::min(per_batch, rescan.size() - first);
      std::vector<io_range> ranges(n);
      for (std::size_t i = 0; i < n; ++i) {
        ranges[i] = {file_.get(), geometry_.header_position(rescan[first + i]),
                     buffer_view::host(pages.get() + i * page_bytes, page_bytes)};
      }
      std::memset(pages.get(), 0, n * page_bytes);
      const batch_result r = read_batch(ranges);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t s = rescan[first + i];
        info.bytes_read += r.ranges[i].nbytes;
        ++info.headers_read;
        if (!r.ranges[i].ok() || r.ranges[i].nbytes != page_bytes) continue;
        const std::uint8_t* p = pages.get() + i * page_bytes;
        if (std::all_of(p, p + 8, [](std::uint8_t b) { return b == 0; })) continue;  // never written
        block_header h;
        if (!decode_header(p, h) || h.uuid != uuid_ || h.namespace_hash != namespace_hash_ || h.volume != volume_ ||
            h.slot != s || h.data_bytes != geometry_.block_bytes || h.k.type() == key::kind::none) {
          ++info.bad_headers;
          continue;
        }
        slot_meta& m = slots_[s];
        m.k = h.k;
        m.sequence = h.sequence;
        m.data_crc = h.data_crc;
        m.state = slot_state::valid;
        next_sequence = std::max(next_sequence, h.sequence + 1);
      }
    }
  }

  // The index: one slot per key (the newest when a key was found twice), the oldest blocks nearest eviction.
  std::vector<std::uint32_t> held;
  for (std::uint32_t s = 0; s < geometry_.slots; ++s) {
    if (slots_[s].state == slot_state::valid) held.push_back(s);
  }
  std::sort(held.begin(), held.end(), [&](std::uint32_t a, std::uint32_t b) {
    return slots_[a].sequence < slots_[b].sequence;
  });
  for (std::uint32_t s : held) {
    slot_meta& m = slots_[s];
    next_sequence = std::max(next_sequence, m.sequence + 1);
    auto [it, inserted] = map_.try_emplace(m.k, s);
    if (!inserted) {
      slot_meta& older = slots_[it->second];
      queue_remove(it->second);
      older = slot_meta{};
      --blocks_;
      it->second = s;
    }
    queue_push_head(s, 2);
    ++blocks_;
  }
  for (std::uint32_t s = geometry_.slots; s-- > 0;) {
    if (slots_[s].state == slot_state::free) free_.push_back(s);  // taken from the back: low slots first
  }
  info.blocks += blocks_;
  info.from_checkpoint = info.from_checkpoint && from_checkpoint;
  if (!from_checkpoint) info.clean = false;
  return next_sequence;
}

}  // namespace gdskit::kv::detail
