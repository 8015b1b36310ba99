// The shared state of one submitted batch: per-range completion (first outcome wins), the batch's readiness
// (condition variable and eventfd), its deadline and cancellation, and the holds that keep it unreleased while
// a request or copy may still touch the caller's memory.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/open_file.hpp"
#include "gdskit/batch.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::detail {

/// A range as the batch keeps it: the file held open, its memory, and where it lies in the file.
struct batch_range {
  std::shared_ptr<engine::open_file> file;
  std::uint64_t offset = 0;
  buffer_view memory;
  std::uint32_t crc32c = 0;  // the expected checksum of a checksummed read
};

struct batch_state {
  using clock = std::chrono::steady_clock;

  batch_state(io_direction d, const batch_options& o, std::size_t nranges);
  ~batch_state();
  batch_state(const batch_state&) = delete;
  batch_state& operator=(const batch_state&) = delete;

  io_direction dir;
  batch_options options;
  std::vector<batch_range> ranges;
  clock::time_point started = clock::now();

  /// Records the outcome of range `i` unless it already has one or is claimed (a deadline or cancel got there
  /// first); returns whether this call decided it. The batch becomes ready with its last range.
  bool complete(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s = 0, std::uint32_t crc = 0);
  /// Claims open range `i` before bytes are copied into (or out of) its memory, so that a deadline or cancel
  /// cannot report it while they move: false when it already has its outcome. A claimed range is then either
  /// given its outcome (finish) or opened again (unclaim) for its next part.
  bool claim(std::size_t i) noexcept;
  void unclaim(std::size_t i) noexcept;
  void finish(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s = 0, std::uint32_t crc = 0);
  /// Asks the CPU to fetch what the driver reads and writes of range `i` (its description, its state, its
  /// result) ahead of time: a driver goes through the ranges in file order, which is random order in memory for
  /// a batch of random ranges, and each of those was a cache miss when it got there.
  void prefetch(std::size_t i) const noexcept {
    prefetch_both_ends(&ranges[i], 0);
    __builtin_prefetch(&decided_[i]);
    prefetch_result(i);
  }
  /// Fetches range `i`'s result slot for writing: a driver about to decide several ranges asks for all their
  /// slots first, so that their cache misses overlap instead of each stalling the atomic that follows its store.
  void prefetch_result(std::size_t i) const noexcept { prefetch_both_ends(&result_.ranges[i], 1); }
  /// Whether range `i` has its outcome or is being delivered (work on it can stop).
  bool decided(std::size_t i) const noexcept {
    return decided_[i].load(std::memory_order_acquire) != k_open;
  }
  /// Completes every undecided range with `ec` (ETIMEDOUT at the deadline, ECANCELED on cancel). Returns how
  /// many it completed.
  std::size_t complete_rest(std::error_code ec);
  /// Whether the batch should stop starting work: ready, cancelled or past its deadline.
  bool stopping() const noexcept { return stop_.load(std::memory_order_acquire); }
  void request_stop() noexcept;

  /// A request or copy that targets caller memory begins (hold) or ends (release_hold). The batch is released
  /// once it is ready and no hold remains.
  void hold(std::size_t n = 1) noexcept { holds_.fetch_add(n, std::memory_order_acq_rel); }
  void release_hold(std::size_t n = 1);

  /// Counts the batch as an asynchronous operation of each of its files until it is released (close() waits
  /// for it), and takes the submission hold: the core gives it back (release_hold) once it will start no
  /// further request for the batch, so the batch cannot be released between a check and a request's start.
  void attach_files();

  /// An eventfd that becomes readable (for good) once the batch stops: ready, past its deadline or cancelled.
  /// The drivers wait on it beside their own completions.
  int stop_fd() const noexcept { return stop_fd_.get(); }

  /// Called once the last range is decided, under no lock, before waiters wake (the routes' own cleanup).
  std::function<void()> on_ready;
  /// Runs `f` once the batch is ready: at once on this thread when it already is, else on a thread of the
  /// shared pool after the waiters woke (never on the thread that completed the batch: that may be a CUDA
  /// callback, where no CUDA call may run, or a driver that must go on). Those added before it was ready run
  /// one after another in the order they were added; an exception one throws is logged and dropped.
  void add_callback(std::function<void()> f);

  bool ready() const noexcept { return ready_.load(std::memory_order_acquire); }
  bool released() const noexcept { return released_.load(std::memory_order_acquire); }
  void wait_ready() const;
  bool wait_ready_until(clock::time_point t) const;
  void wait_released() const;
  /// Blocks until at most `n` ranges are undecided (or the batch is ready); returns how many are.
  std::size_t wait_undecided_at_most(std::size_t n) const;
  int event_fd() const noexcept { return event_fd_.get(); }
  const batch_result& result() const noexcept { return result_; }

  /// Counts what the routes did (for batch_result::routes).
  std::atomic<std::size_t> routed_host{0}, routed_staged{0}, routed_gds{0}, requests{0}, buffered{0};
  /// Checksummed reads whose bytes did not match (for batch_result::checksum_mismatches).
  std::atomic<std::size_t> checksum_mismatches{0};

 private:
  static constexpr std::uint8_t k_open = 0, k_claimed = 1, k_done = 2;
  void record(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s, std::uint32_t crc);
  void became_ready();
  void maybe_released();
  template <typename T>
  static void prefetch_both_ends(const T* p, int for_write) noexcept {
    // An item that spans two cache lines is fetched whole.
    const auto* first = reinterpret_cast<const char*>(p);
    if (for_write != 0) {
      __builtin_prefetch(first, 1);
      __builtin_prefetch(first + sizeof(T) - 1, 1);
    } else {
      __builtin_prefetch(first);
      __builtin_prefetch(first + sizeof(T) - 1);
    }
  }

  std::unique_ptr<std::atomic<std::uint8_t>[]> decided_;
  std::atomic<std::size_t> undecided_{0};
  mutable std::atomic<std::size_t> wake_at_{0};  // a waiter wants to hear when undecided_ falls to this
  std::atomic<std::size_t> holds_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> released_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  posix::unique_fd event_fd_;
  posix::unique_fd stop_fd_;
  std::error_code stop_ec_;  // what complete_rest gave the open ranges (guarded by mutex_)
  std::vector<std::function<void()>> callbacks_;  // add_callback's, until the batch is ready (guarded by mutex_)
  batch_result result_;
  std::vector<std::shared_ptr<engine::open_file>> files_;
};

/// Fires batches' deadlines from one process-wide thread that sleeps until the earliest one (no polling).
/// The timer holds a weak reference, dropped when the batch becomes ready: a batch that completes before its
/// deadline costs nothing more.
void arm_deadline(const std::shared_ptr<batch_state>& state, batch_state::clock::time_point when);
/// How many batches the deadline timer still holds (tests: a batch is let go once it is ready).
std::size_t armed_deadlines();

}  // namespace gdskit::detail
