#include "engine/pipeline.hpp"

#include <cerrno>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/arith.hpp"
#include "engine/open_file.hpp"
#include "engine/file_range.hpp"
#include "engine/piece_cursor.hpp"
#include "engine/residency.hpp"
#include "engine/thread_pool.hpp"
#include "gdskit/error.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::engine {
namespace {


using piece = piece_cursor::piece;

}  // namespace

std::size_t piece_count(std::uint64_t offset, std::size_t nbytes, std::size_t slot_bytes) noexcept {
  if (nbytes == 0 || slot_bytes == 0) return 0;
  return static_cast<std::size_t>((offset + nbytes - 1) / slot_bytes - offset / slot_bytes + 1);
}

namespace {

bool cancelled(const staged_options& o) {
  return (o.cancel != nullptr && o.cancel->load()) || (o.cancelled && o.cancelled());
}

// Shared state of one transfer: the first error wins and stops every lane.
struct transfer {
  transfer(const open_file& f, copier& c, const staged_options& o, std::vector<transfer_extent> e,
           bool join_contiguous = false)
      : file(f), cp(c), options(o), cursor(std::move(e), join_contiguous) {}
  const open_file& file;
  copier& cp;
  const staged_options& options;
  piece_cursor cursor;
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr first_error;
  std::uint64_t first_error_offset = UINT64_MAX;
  staged_stats stats;

  // The next piece, cut at the request size the scheduler asks for now (at most a slot, whole 4 KiB blocks).
  std::optional<piece> take() {
    std::size_t want = options.request_bytes ? options.request_bytes() : options.piece_bytes;
    const std::size_t slot = cp.slot_bytes();
    if (want == 0 || want > slot || want % 4096 != 0) want = slot;
    return cursor.take(want);
  }

  void fail(std::uint64_t at) {
    {
      std::lock_guard lock(mutex);
      // Keep the error of the lowest file offset: the one a sequential reader would have met first.
      if (!first_error || at < first_error_offset) {
        first_error = std::current_exception();
        first_error_offset = at;
      }
      failed = true;
    }
    cursor.wake_all();  // parked lanes see the failure now, not at their next timeout
  }
  bool stopped() const {
    return failed.load(std::memory_order_relaxed) || cancelled(options);
  }
  void count(std::size_t direct, std::size_t buffered, std::size_t waits) {
    std::lock_guard lock(mutex);
    ++stats.pieces;
    stats.direct_bytes += direct;
    stats.buffered_bytes += buffered;
    stats.slot_waits += waits;
  }
};

// Reads a piece's aligned cover into slot memory so that the piece starts at slot + (offset - cover start).
// Returns the number of the piece's bytes that exist (short only at end of file).
std::size_t read_piece(const open_file& f, const piece& p, std::byte* slot, bool& direct_used) {
  std::error_code ec;
  const bool direct = f.choice.direct && !prefer_page_cache(f, p.offset, p.nbytes);
  direct_used = direct;
  if (direct) {
    const std::size_t a = f.choice.alignment;
    const std::uint64_t a0 = align_down(p.offset, a);
    const std::uint64_t a1 = align_up(p.offset + p.nbytes, a);
    std::size_t got = posix::pread_full(f.direct_fd.get(), slot, a1 - a0, a0, ec);
    if (ec) throw error(ec, "pread", f.path.string(), static_cast<std::int64_t>(a0), a1 - a0);
    const std::size_t head = p.offset - a0;
    return got > head ? std::min(got - head, p.nbytes) : 0;
  }
  const std::size_t head = p.offset % f.choice.alignment;
  std::size_t got = posix::pread_full(f.fd.get(), slot + head, p.nbytes, p.offset, ec);
  if (ec) throw error(ec, "pread", f.path.string(), static_cast<std::int64_t>(p.offset), p.nbytes);
  return got;
}

// Writes a piece that sits in slot memory at its aligned position: the aligned middle through O_DIRECT, the
// partial blocks at either end through the buffered descriptor.
void write_piece(const open_file& f, const piece& p, std::byte* slot, bool& direct_used) {
  std::error_code ec;
  const std::size_t a = f.choice.alignment;
  const std::uint64_t a0 = align_down(p.offset, a);
  const std::uint64_t end = p.offset + p.nbytes;
  auto put = [&](int fd, std::uint64_t from, std::uint64_t to) {
    if (to <= from) return;
    posix::pwrite_full(fd, slot + (from - a0), to - from, from, ec);
    if (ec) throw error(ec, "pwrite", f.path.string(), static_cast<std::int64_t>(from), to - from);
  };
  if (!f.choice.direct) {
    direct_used = false;
    put(f.fd.get(), p.offset, end);
    return;
  }
  direct_used = true;
  const std::uint64_t mid0 = std::min(align_up(p.offset, a), end);
  const std::uint64_t mid1 = std::max(align_down(end, a), mid0);
  put(f.fd.get(), p.offset, mid0);
  put(f.direct_fd.get(), mid0, mid1);
  put(f.fd.get(), mid1, end);
}

void check_cancel(const transfer& t) {
  if (cancelled(t.options)) {
    throw error(errno_code(ECANCELED), "staged transfer", t.file.path.string(), -1, 0, "cancelled");
  }
}

// Waits for every copy still pending on a lane's slots: no copy may touch a slot after the transfer returns.
// A failure here is recorded after any earlier one (a sequential reader would have met that one first).
void drain_lane(transfer& t, unsigned lane, const std::vector<bool>& pending) {
  for (unsigned s = 0; s < pending.size(); ++s) {
    if (!pending[s]) continue;
    try {
      t.cp.wait(lane, s);
    } catch (...) {
      t.fail(UINT64_MAX - 1);
    }
  }
}

// A worker's use of a lane, from begin_lane to end_lane (which runs after the lane's last wait). The lane's slot
// memory is readied before its first piece, or earlier while it is parked, once the adaptive depth comes within
// one doubling of it: a probe of the next depth finds its lanes set up, and a transfer whose depth stays at 2
// pins 4 lanes, not the 16 it leased.
class lane_session {
 public:
  lane_session(copier& cp, unsigned lane) : cp_(cp), lane_(lane) { cp_.begin_lane(lane_); }
  ~lane_session() { cp_.end_lane(lane_); }
  lane_session(const lane_session&) = delete;
  lane_session& operator=(const lane_session&) = delete;

  void ready() {
    if (ready_) return;
    cp_.ready_lane(lane_);
    ready_ = true;
  }
  // Readies a parked lane ahead of use; a failure here is left for ready() to meet if the lane is ever needed,
  // so a lane the transfer never uses cannot fail it.
  void ready_ahead_of(unsigned depth) noexcept {
    if (ready_ || lane_ / 2 >= depth) return;
    try {
      ready();
    } catch (...) {
    }
  }

 private:
  copier& cp_;
  unsigned lane_;
  bool ready_ = false;
};

// False (after waiting to be woken) while the adaptive depth keeps this lane idle; it holds no piece then.
bool lane_active(transfer& t, lane_session& session, unsigned lane) {
  if (!t.options.active_lanes) {
    session.ready();
    return true;
  }
  const unsigned depth = t.options.active_lanes();
  if (!t.cursor.exhausted()) session.ready_ahead_of(depth);  // none at the end, when nothing is left to take
  return t.cursor.may_take(lane, depth);
}

void read_lane(transfer& t, unsigned lane) {
  copier& cp = t.cp;
  const unsigned nslots = cp.slots_per_lane();
  std::vector<bool> pending(nslots, false);
  unsigned k = 0;
  std::optional<lane_session> session;  // ends after drain_lane
  try {
    session.emplace(cp, lane);
    while (!t.stopped()) {
      if (!lane_active(t, *session, lane)) continue;
      const std::optional<piece> next = t.take();
      if (!next) break;
      session->ready();
      const piece& p = *next;
      const unsigned s = k++ % nslots;
      std::size_t waits = 0;
      if (pending[s]) {
        cp.wait(lane, s);  // the slot's previous copy must finish before the file overwrites it
        pending[s] = false;
        ++waits;
      }
      if (t.options.on_piece) t.options.on_piece(p.offset);
      try {
        bool direct = false;
        std::byte* mem = cp.slot(lane, s);
        const std::size_t got = read_piece(t.file, p, mem, direct);
        if (got < p.nbytes) t.cursor.ended_short(p, got);
        if (got > 0) {
          const std::size_t at = p.offset % t.file.choice.alignment;
          cp.to_far(lane, s, at, p.far, got);
          pending[s] = true;
        }
        t.count(direct ? got : 0, direct ? 0 : got, waits);
        if (direct && t.options.on_direct_bytes) t.options.on_direct_bytes(got, p.request_bytes);
        if (t.options.on_bytes) t.options.on_bytes(got);
      } catch (...) {
        t.fail(p.offset);
      }
    }
  } catch (...) {
    t.fail(0);
  }
  drain_lane(t, lane, pending);
}

void write_lane(transfer& t, unsigned lane) {
  copier& cp = t.cp;
  const unsigned nslots = cp.slots_per_lane();
  const std::size_t a = t.file.choice.alignment;
  // Copies into the next slot are started before the current slot is written, so the device->host copy of
  // piece i+1 overlaps the file write of piece i.
  struct staged_piece {
    piece p;
    unsigned slot;
  };
  std::vector<staged_piece> queue;
  std::vector<bool> pending(nslots, false);
  unsigned k = 0;
  std::optional<lane_session> session;  // ends after drain_lane
  auto start_next = [&]() -> bool {
    // A lane above the adaptive depth takes no new piece (it finishes those it holds, then waits).
    if (t.stopped() || !lane_active(t, *session, lane)) return false;
    const std::optional<piece> next = t.take();
    if (!next) return false;
    session->ready();
    const piece& p = *next;
    const unsigned s = k++ % nslots;
    // A piece may span back-to-back extents (a gathered write): one copy per part, into its place in the slot.
    // The slot is pending from the first copy on, so that a copy that fails after others were queued still
    // has them waited for before the lane goes back to the pool.
    pending[s] = true;
    t.cursor.for_each_segment(p, [&](std::uintptr_t far, std::size_t n, std::size_t at) {
      cp.from_far(lane, s, p.offset % a + at, far, n);
    });
    queue.push_back({p, s});
    return true;
  };
  try {
    session.emplace(cp, lane);
    while (!t.stopped()) {
      if (queue.empty()) {
        // Holding nothing: done once every piece is handed out; else start copies (or wait while parked, so
        // the lane can join when the depth grows).
        if (t.cursor.exhausted()) break;
        for (unsigned s = 0; s + 1 < std::max(2u, nslots) && start_next(); ++s) {
        }
        continue;
      }
      staged_piece cur = queue.front();
      queue.erase(queue.begin());
      start_next();
      const piece& p = cur.p;
      try {
        cp.wait(lane, cur.slot);
        pending[cur.slot] = false;
        check_cancel(t);
        if (t.options.on_piece) t.options.on_piece(p.offset);
        bool direct = false;
        write_piece(t.file, p, cp.slot(lane, cur.slot), direct);
        t.count(direct ? p.nbytes : 0, direct ? 0 : p.nbytes, 0);
        if (direct && t.options.on_direct_bytes) t.options.on_direct_bytes(p.nbytes, p.request_bytes);
        if (t.options.on_bytes) t.options.on_bytes(p.nbytes);
      } catch (...) {
        t.fail(p.offset);
        break;
      }
    }
  } catch (...) {
    t.fail(0);
  }
  drain_lane(t, lane, pending);
}

// The smallest piece a transfer may be cut into.
std::size_t smallest_piece(const copier& cp, const staged_options& o) {
  std::size_t smallest = cp.slot_bytes();
  if (o.piece_bytes != 0 && o.piece_bytes < smallest && o.piece_bytes % 4096 == 0) smallest = o.piece_bytes;
  if (o.request_bytes && o.min_request_bytes != 0 && o.min_request_bytes < smallest) smallest = o.min_request_bytes;
  return smallest;
}

// More lanes than the transfer has pieces (at the smallest size) would idle.
unsigned transfer_lanes(const copier& cp, std::size_t max_pieces) {
  return static_cast<unsigned>(std::min<std::size_t>(cp.lanes(), max_pieces));
}

void finish(transfer& t, staged_stats* stats) {
  if (stats != nullptr) *stats = t.stats;
  if (t.first_error) std::rethrow_exception(t.first_error);
  check_cancel(t);
}

}  // namespace

std::size_t staged_read(const open_file& f, copier& cp, std::uintptr_t far, std::size_t nbytes, std::uint64_t offset,
                        const staged_options& options, staged_stats* stats) {
  check_file_range("pread", f.path.native(), false, offset, nbytes);
  if (nbytes == 0) return 0;
  const std::uint64_t size = f.current_size();
  if (offset >= size) return 0;
  nbytes = static_cast<std::size_t>(std::min<std::uint64_t>(nbytes, size - offset));
  transfer t(f, cp, options, {{offset, nbytes, far}});
  const unsigned lanes = transfer_lanes(cp, piece_count(offset, nbytes, smallest_piece(cp, options)));
  parallel_for(lanes, lanes, [&](std::size_t lane) { read_lane(t, static_cast<unsigned>(lane)); });
  finish(t, stats);
  return t.cursor.moved();
}

std::size_t staged_write(const open_file& f, copier& cp, std::uintptr_t far, std::size_t nbytes, std::uint64_t offset,
                         const staged_options& options, staged_stats* stats) {
  const staged_extent one{far, offset, nbytes};
  return staged_write_extents(f, cp, std::span(&one, 1), options, stats);
}

std::size_t staged_write_extents(const open_file& f, copier& cp, std::span<const staged_extent> extents,
                                 const staged_options& options, staged_stats* stats) {
  std::vector<transfer_extent> cut;
  std::size_t total = 0;
  std::size_t pieces = 0;
  const std::size_t smallest = smallest_piece(cp, options);
  for (const staged_extent& e : extents) {
    check_file_range("pwrite", f.path.native(), true, e.offset, e.nbytes);
    if (e.nbytes == 0) continue;
    cut.push_back({e.offset, e.nbytes, e.far});
    total += e.nbytes;
    pieces += piece_count(e.offset, e.nbytes, smallest);
  }
  if (total == 0) return 0;
  if (f.mode == open_mode::read) {
    throw error(errno_code(EBADF), "pwrite", f.path.string(), static_cast<std::int64_t>(cut.front().offset), total,
                "file opened for reading only");
  }
  // Extents that follow one another in the file are cut as one range: the joins between them fall inside
  // aligned O_DIRECT requests, not into small buffered writes (which on ext4 wait for every O_DIRECT write in
  // flight on the file).
  transfer t(f, cp, options, std::move(cut), true);
  const unsigned lanes = transfer_lanes(cp, pieces);
  parallel_for(lanes, lanes, [&](std::size_t lane) { write_lane(t, static_cast<unsigned>(lane)); });
  finish(t, stats);
  return total;
}

}  // namespace gdskit::engine
