// Adaptive I/O scheduling: one controller per block device and direction finds, while transfers run, the
// in-flight depth and request size that give the best throughput. The host engine and the staged path ask it
// for a shape and report completed bytes; a device profile (device_profile.hpp) is its starting point.
//
// The search is a hill climb over powers of two, one coordinate at a time (depth, then request size, then depth
// again if the size moved): a candidate replaces the incumbent only when two measurement windows show it faster by
// a margin, against the incumbent measured again just before it, so neither noise nor a device whose rate wanders
// can walk the shape far from the best. Once converged the controller holds the shape, searches again when the
// measured rate drifts away from the converged one, and now and then measures the held shape's neighbours again
// (a device's best shape can move without its rate at the held one moving: a shape learned while the device was
// busy or still allocating its blocks). Shapes that tie are told apart by CPU cost: a smaller request size must
// win by a clear margin, since every request costs the kernel and the device the same fixed work.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace gdskit::engine {

/// How a stream of O_DIRECT requests is issued: requests in flight and bytes per request.
struct io_shape {
  unsigned depth = 1;
  std::size_t request_bytes = std::size_t{4} << 20;
  bool operator==(const io_shape&) const = default;
};

enum class io_dir { read, write };

/// Where a device without a profile starts: shallow, so deep queues are found by growing and a
/// cache-footprint cliff is never started behind.
inline constexpr io_shape k_start_shape{2, std::size_t{4} << 20};

struct adaptive_limits {
  unsigned min_depth = 1;
  unsigned max_depth = 64;
  std::size_t min_request_bytes = std::size_t{1} << 20;
  std::size_t max_request_bytes = std::size_t{16} << 20;
  /// A measurement window holds at least this many bytes and 2 x depth x request bytes, and lasts min_window_s.
  std::size_t min_window_bytes = std::size_t{32} << 20;
  double min_window_s = 0.01;
  /// A candidate replaces the incumbent only when it measures this much faster.
  double gain = 1.05;
  /// Smaller requests cost CPU per byte (each request pays the kernel's and the device's per-request work): a
  /// candidate with requests half the incumbent's size must win by this factor on top of the margin (a quarter:
  /// its square). A search from larger requests keeps them against smaller ones that are only a few percent
  /// faster. (A held shape is left only for a candidate that beats it by the margin, so a small request size
  /// once held stays while larger ones merely tie.)
  double smaller_request_gain = 1.04;
  /// Converged: re-probe after two windows in a row that differ from the converged rate by more than this.
  double drift = 0.3;
  /// Converged: the neighbours of the held shape are measured again after this many windows held, twice as many
  /// after each check that left the shape where it was (at most 16 x), and a learned shape after half of it
  /// (it was found in another process, maybe on a busier device). 0: never.
  unsigned recheck_windows = 64;
  /// Transfers smaller than this never run a probe candidate (they use the incumbent and are not measured).
  std::size_t min_probe_transfer_bytes = std::size_t{64} << 20;
  /// Which coordinates may move (a GDSKIT_* setting pins one).
  bool depth_fixed = false;
  bool request_fixed = false;
};

class adaptive_controller {
 public:
  explicit adaptive_controller(io_shape start, adaptive_limits limits = {});

  /// The incumbent: the best shape measured so far (the start until something beat it).
  io_shape best() const;
  /// The shape a probing transfer should use now (a candidate while probing, else the incumbent).
  io_shape shape() const;
  /// A transfer of `nbytes` starts / ends at time `now_s` (seconds on any steady clock). Time between
  /// transfers is not counted in any window. Returns whether this transfer probes (see min_probe_transfer_bytes).
  bool begin(std::size_t nbytes, double now_s);
  void end(bool probing, double now_s);
  /// `nbytes` completed at `now_s` by a probing transfer, in requests of `request_bytes` (0: of the current
  /// shape's size). Requests of another size than the shape being measured say nothing about it: they are not
  /// counted, and the window restarts at the first completion of the measured size after them (a transfer
  /// that planned its requests before a size probe began cannot follow it).
  void complete(std::size_t nbytes, double now_s, std::size_t request_bytes = 0);

  /// Holds the start shape as if it had converged at `rate` bytes per second (a learned profile): no probing
  /// until two windows in a row differ from that rate by more than the drift margin. Call before first use.
  void resume(double rate);

  /// The in-flight requests one of the probing transfers running now may use: `depth` shared among them
  /// (rounded up, at least 1), so that the depth measured is the device's, however many transfers share it.
  unsigned depth_share(unsigned depth) const;

  bool converged() const;
  /// Candidates measured so far (re-probes included).
  unsigned probes() const;
  /// Searches started from a held shape because its rate drifted (not counting the periodic re-checks).
  unsigned drift_searches() const;
  /// Periodic re-checks of a held shape's neighbours started so far.
  unsigned rechecks() const;
  /// Last converged rate in bytes per second (0 before convergence).
  double converged_rate() const;
  /// "depth 2, 4.00 MiB; adaptive (converged after 5 probes)".
  std::string describe() const;

 private:
  enum class phase { measure_start, depth_up, depth_down, size_up, size_down, hold };
  // All called with the mutex held.
  void judge(double rate);
  // The verdict on candidate `cand` measured at `rate` against the incumbent at `incumbent_rate`.
  void decide(double rate, double incumbent_rate, io_shape cand);
  bool candidate(phase p, io_shape& out) const;
  phase after(phase p, bool moved);
  void enter(phase p);
  std::size_t window_bytes() const;
  void close_window();
  double batch_gap(double mean_interval) const;
  double margin() const;
  // The factor by which candidate `cand` must measure faster than the incumbent (margin and request size).
  double needed(io_shape cand) const;
  double drift_tolerance() const;
  // Starts a search from the held shape, whose rate is measured as `rate` now.
  void search_again(double rate);

  mutable std::mutex mutex_;
  adaptive_limits limits_;
  io_shape best_;
  io_shape current_;
  io_shape from_;              // candidates step from here: the incumbent, or the last tie when walking a plateau
  unsigned ties_ = 0;
  double best_rate_ = 0;
  phase phase_ = phase::measure_start;
  bool moved_ = false;         // the current direction beat the incumbent at least once
  bool size_moved_ = false;    // request size changed in this round: depth gets a second look
  unsigned rounds_ = 0;
  unsigned probes_ = 0;
  unsigned drift_windows_ = 0;
  double converged_rate_ = 0;
  bool resumed_ = false;
  unsigned drift_searches_ = 0;
  unsigned held_windows_ = 0;  // windows judged in the current hold
  unsigned recheck_due_ = 0;   // held windows before the next re-check (0: none)
  unsigned rechecks_ = 0;
  bool rechecking_ = false;    // the search under way is a re-check, begun from recheck_from_
  io_shape recheck_from_;
  double last_rate_ = 0;       // the last window's rate (0: none to compare with)
  double noise_ = 0;           // mean relative difference between consecutive windows of one shape
  unsigned noise_samples_ = 0;
  io_shape measured_;          // the shape the last judged window measured
  double best_at_ = 0;         // when the incumbent's rate was last measured (end of its window)
  bool reference_ = false;     // the window being measured is the incumbent's, taken again before next_
  io_shape next_;
  bool confirming_ = false;    // the window being measured is the incumbent's, taken again after candidate next_
  double first_rate_ = 0;      // (whose rate this is)
  // The window being measured.
  unsigned active_ = 0;         // probing transfers running
  double active_since_ = 0;     // when active_ went from 0 to 1
  double window_s_ = 0;         // active seconds accumulated
  std::size_t window_bytes_ = 0;
  bool stale_ = false;          // completions of another request size arrived since the window began
  std::size_t window_count_ = 0;  // completions counted in the window
  bool closing_ = false;        // the window is full; it closes after the batch of completions it is in
  double close_at_ = 0;         // the last completion of that batch
  double close_s_ = 0;          // the window's active seconds up to close_at_
  std::size_t settle_ = 0;      // bytes still to complete above a depth that was just cut (not measured)
  bool restarting_ = false;     // the next window starts after the batch of completions that ends at restart_at_
  double restart_at_ = 0;
  double last_interval_ = 0;    // mean seconds between completions in the last window
  unsigned batch_left_ = 0;     // completions that may still join the batch being closed or restarted after
};

/// The process-wide controller for (device, direction), created from `start` and `limits` on first use. Later
/// calls return the same controller (its converged state survives between transfers and file handles).
/// `client` separates users whose costs per request differ (see io_schedule.hpp).
/// `resume_rate` > 0: a new controller holds `start` as converged at that rate (bytes per second).
std::shared_ptr<adaptive_controller> controller_for(dev_t device, io_dir dir, int client, io_shape start,
                                                    const adaptive_limits& limits, double resume_rate = 0);

/// Rounds `v` down to a power of two within [lo, hi].
std::size_t clamp_pow2(std::size_t v, std::size_t lo, std::size_t hi);

/// Seconds on the steady clock.
double steady_now_s();

}  // namespace gdskit::engine
