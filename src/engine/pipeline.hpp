// The staged path: file <-> pinned host slots <-> destination, with reads running ahead of copies.
// The copier is an interface so that CI (no GPU) tests ordering, slot reuse, errors and cancellation with a
// host-memory copier; the CUDA copier (cuda_copier.hpp) issues asynchronous copies on per-lane streams.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "engine/open_file.hpp"

namespace gdskit::engine {

/// Moves bytes between staging slots and the far side (device memory). One lane per worker thread; a lane's
/// calls all come from one thread. Methods throw gdskit::error on failure.
class copier {
 public:
  virtual ~copier() = default;
  virtual unsigned lanes() const = 0;
  virtual unsigned slots_per_lane() const = 0;
  virtual std::size_t slot_bytes() const = 0;
  /// Called on the worker thread before it uses `lane` (the CUDA copier makes its context current here). When
  /// it throws, the transfer fails with that error and end_lane is not called for the lane.
  virtual void begin_lane(unsigned lane) = 0;
  /// Called on the lane's worker thread after begin_lane and before the lane's first slot() or copy: gives the
  /// lane its slot memory when it has none yet (the CUDA copier pins the slots and creates the stream and
  /// events here, the host copier maps its slots). A lane parked by the adaptive depth is readied only when
  /// the depth comes within one doubling of it, so a transfer whose depth stays low sets up few lanes. When it
  /// throws, the transfer fails with that error (end_lane still runs).
  virtual void ready_lane(unsigned lane) = 0;
  /// Called on the same thread when it is done with `lane`, after its last wait, when begin_lane succeeded
  /// (the CUDA copier restores the thread's previous context here).
  virtual void end_lane(unsigned lane) noexcept = 0;
  /// Start of the slot's memory (aligned to at least 4 KiB).
  virtual std::byte* slot(unsigned lane, unsigned slot) = 0;
  /// Starts copying `nbytes` from slot memory at `slot_offset` to `far` (asynchronous).
  virtual void to_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) = 0;
  /// Starts copying `nbytes` from `far` into slot memory at `slot_offset` (asynchronous).
  virtual void from_far(unsigned lane, unsigned slot, std::size_t slot_offset, std::uintptr_t far, std::size_t nbytes) = 0;
  /// Waits until every copy started on this slot has finished (no-op when none is pending).
  virtual void wait(unsigned lane, unsigned slot) = 0;
};

/// Observations of one staged transfer (for tests and reports).
struct staged_stats {
  std::size_t pieces = 0;
  std::size_t direct_bytes = 0;    ///< bytes that went through the O_DIRECT descriptor
  std::size_t buffered_bytes = 0;  ///< bytes that went through the page cache
  std::size_t slot_waits = 0;      ///< times a worker had to wait for a slot's copy before reusing it
};

struct staged_options {
  /// Checked between pieces; when set (or when `cancelled` returns true) the transfer stops and throws
  /// ECANCELED.
  const std::atomic<bool>* cancel = nullptr;
  std::function<bool()> cancelled;
  /// Called with the bytes of each piece when its file I/O finished (any descriptor), for progress.
  std::function<void(std::size_t)> on_bytes;
  /// Test hook, called before each piece's file I/O with the piece's file offset.
  std::function<void(std::uint64_t)> on_piece;
  /// Bytes per piece (file I/O request); 0 or more than the slot size: the slot size.
  std::size_t piece_bytes = 0;
  /// When set, asked for each piece's size as the piece is cut (the adaptive request size; same rules as
  /// piece_bytes), so the size can change while the transfer runs; min_request_bytes is the smallest it returns.
  std::function<std::size_t()> request_bytes;
  std::size_t min_request_bytes = 0;
  /// Lanes allowed to work now (the adaptive depth); lanes above it wait between pieces. Empty: all lanes.
  std::function<unsigned()> active_lanes;
  /// Called with the bytes of each piece that went through O_DIRECT, when its file I/O finished, and the request
  /// size the piece was cut with.
  std::function<void(std::size_t nbytes, std::size_t request_bytes)> on_direct_bytes;
};

/// How many pieces (slot-sized, ending at absolute multiples of slot_bytes) a transfer is cut into: more lanes
/// than this would idle.
std::size_t piece_count(std::uint64_t offset, std::size_t nbytes, std::size_t slot_bytes) noexcept;

/// Reads [offset, offset+nbytes) of `file` to `far` (+0 .. +nbytes). Returns the bytes moved: fewer only at
/// end of file. Throws gdskit::error naming the failing file range on any read or copy error; every copy
/// has finished (or failed) before it returns or throws.
std::size_t staged_read(const open_file& f, copier& cp, std::uintptr_t far, std::size_t nbytes, std::uint64_t offset,
                        const staged_options& options = {}, staged_stats* stats = nullptr);

/// One range of a gathered write: `nbytes` from `far` to file offset `offset`.
struct staged_extent {
  std::uintptr_t far = 0;
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
};

/// Writes every extent through one pipeline (one set of lanes, pieces taken extent after extent in the order
/// given, never spanning two). Returns the bytes written or throws; extents must not overlap.
std::size_t staged_write_extents(const open_file& f, copier& cp, std::span<const staged_extent> extents,
                                 const staged_options& options = {}, staged_stats* stats = nullptr);

/// Writes `nbytes` from `far` to [offset, offset+nbytes) of `file`. Returns nbytes or throws.
std::size_t staged_write(const open_file& f, copier& cp, std::uintptr_t far, std::size_t nbytes, std::uint64_t offset,
                         const staged_options& options = {}, staged_stats* stats = nullptr);

}  // namespace gdskit::engine
