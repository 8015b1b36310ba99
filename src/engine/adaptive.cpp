#include "engine/adaptive.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "gdskit/settings.hpp"

namespace gdskit::engine {
namespace {

constexpr unsigned kMaxTies = 2;

}  // namespace

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::size_t clamp_pow2(std::size_t v, std::size_t lo, std::size_t hi) {
  v = std::clamp(v, lo, hi);
  std::size_t p = 1;
  while (p * 2 <= v) p *= 2;
  return std::max(p, lo);
}

adaptive_controller::adaptive_controller(io_shape start, adaptive_limits limits) : limits_(limits) {
  start.depth = static_cast<unsigned>(clamp_pow2(start.depth, limits_.min_depth, limits_.max_depth));
  start.request_bytes = clamp_pow2(start.request_bytes, limits_.min_request_bytes, limits_.max_request_bytes);
  best_ = current_ = start;
}

io_shape adaptive_controller::best() const {
  std::lock_guard lock(mutex_);
  return best_;
}

io_shape adaptive_controller::shape() const {
  std::lock_guard lock(mutex_);
  return current_;
}

void adaptive_controller::resume(double rate) {
  std::lock_guard lock(mutex_);
  if (!(rate > 0)) return;
  best_rate_ = rate;
  resumed_ = true;
  enter(phase::hold);
}

unsigned adaptive_controller::depth_share(unsigned depth) const {
  std::lock_guard lock(mutex_);
  const unsigned n = std::max(active_, 1u);
  return std::max(1u, (depth + n - 1) / n);
}

bool adaptive_controller::converged() const {
  std::lock_guard lock(mutex_);
  return phase_ == phase::hold;
}

unsigned adaptive_controller::probes() const {
  std::lock_guard lock(mutex_);
  return probes_;
}

double adaptive_controller::converged_rate() const {
  std::lock_guard lock(mutex_);
  return phase_ == phase::hold ? converged_rate_ : 0;
}

std::string adaptive_controller::describe() const {
  std::lock_guard lock(mutex_);
  std::string state = resumed_                ? std::string("holding the learned shape")
                      : phase_ == phase::hold ? fmt::format("converged after {} probes", probes_)
                      : phase_ == phase::measure_start ? std::string("measuring")
                                                       : fmt::format("probing, {} probes", probes_);
  return fmt::format("depth {}, {}; adaptive ({})", best_.depth, format_size(best_.request_bytes), state);
}

bool adaptive_controller::begin(std::size_t nbytes, double now_s) {
  if (nbytes < limits_.min_probe_transfer_bytes) return false;
  std::lock_guard lock(mutex_);
  if (active_++ == 0) active_since_ = now_s;
  return true;
}

void adaptive_controller::end(bool probing, double now_s) {
  if (!probing) return;
  std::lock_guard lock(mutex_);
  if (active_ == 0) return;
  if (--active_ == 0) window_s_ += now_s - active_since_;
}

std::size_t adaptive_controller::window_bytes() const {
  return std::max(limits_.min_window_bytes, 2 * static_cast<std::size_t>(current_.depth) * current_.request_bytes);
}

void adaptive_controller::complete(std::size_t nbytes, double now_s, std::size_t request_bytes) {
  std::lock_guard lock(mutex_);
  if (request_bytes != 0 && request_bytes != current_.request_bytes) {
    stale_ = true;
    return;
  }
  if (stale_) {
    // The time so far went to requests of another size: measure from here.
    stale_ = false;
    window_bytes_ = 0;
    window_s_ = 0;
    active_since_ = now_s;
    return;
  }
  window_bytes_ += nbytes;
  if (window_bytes_ < window_bytes()) return;
  const double seconds = window_s_ + (active_ > 0 ? now_s - active_since_ : 0.0);
  if (seconds < limits_.min_window_s || seconds <= 0) return;
  const double rate = static_cast<double>(window_bytes_) / seconds;
  window_bytes_ = 0;
  window_s_ = 0;
  active_since_ = now_s;
  judge(rate);
}

bool adaptive_controller::candidate(phase p, io_shape& out) const {
  out = from_;
  switch (p) {
    case phase::depth_up: out.depth *= 2; break;
    case phase::depth_down: out.depth /= 2; break;
    case phase::size_up: out.request_bytes *= 2; break;
    case phase::size_down: out.request_bytes /= 2; break;
    default: return false;
  }
  const bool depth_phase = p == phase::depth_up || p == phase::depth_down;
  if (depth_phase ? limits_.depth_fixed : limits_.request_fixed) return false;
  return out.depth >= limits_.min_depth && out.depth <= limits_.max_depth &&
         out.request_bytes >= limits_.min_request_bytes && out.request_bytes <= limits_.max_request_bytes;
}

// Where the search goes when direction `p` is over; `moved` says whether it beat the incumbent at least once
// (then the opposite direction of the same coordinate cannot win and is skipped).
adaptive_controller::phase adaptive_controller::after(phase p, bool moved) {
  switch (p) {
    case phase::measure_start: return phase::depth_up;
    case phase::depth_up: return moved ? phase::size_up : phase::depth_down;
    case phase::depth_down: return phase::size_up;
    case phase::size_up:
      if (!moved) return phase::size_down;
      [[fallthrough]];
    default:
      // End of a round: a request size that moved changes which depth is best, so depth gets one more look.
      if (size_moved_ && rounds_ == 0 && !limits_.depth_fixed) {
        ++rounds_;
        size_moved_ = false;
        return phase::depth_up;
      }
      return phase::hold;
  }
}

void adaptive_controller::enter(phase p) {
  while (true) {
    phase_ = p;
    moved_ = false;
    from_ = best_;
    ties_ = 0;
    if (p == phase::hold) {
      current_ = best_;
      converged_rate_ = best_rate_;
      drift_windows_ = 0;
      return;
    }
    io_shape cand;
    if (candidate(p, cand)) {
      current_ = cand;
      ++probes_;
      return;
    }
    p = after(p, false);
  }
}

void adaptive_controller::judge(double rate) {
  if (phase_ == phase::measure_start) {
    best_rate_ = rate;
    enter(after(phase_, false));
    return;
  }
  if (phase_ == phase::hold) {
    if (std::fabs(rate / converged_rate_ - 1.0) <= limits_.drift) {
      drift_windows_ = 0;
      converged_rate_ = 0.8 * converged_rate_ + 0.2 * rate;
      return;
    }
    if (++drift_windows_ < 2) return;
    // The device changed under us (another tenant, its cache, a different region): the old comparisons are
    // stale, so the incumbent's rate is taken as measured now and the search starts again from it.
    resumed_ = false;
    best_rate_ = rate;
    rounds_ = 0;
    size_moved_ = false;
    enter(phase::depth_up);
    return;
  }
  io_shape cand;
  if (rate > best_rate_ * limits_.gain) {
    best_ = from_ = current_;
    best_rate_ = rate;
    ties_ = 0;
    moved_ = true;
    if (phase_ == phase::size_up || phase_ == phase::size_down) size_moved_ = true;
    if (candidate(phase_, cand)) {  // keep going the same way
      current_ = cand;
      ++probes_;
      return;
    }
    enter(after(phase_, true));
    return;
  }
  // A tie (within the margin) may hide a step beyond it, as a cache-footprint cliff behind a plateau does: walk
  // on a little from the candidate, keeping the incumbent as the best measured.
  if (rate * limits_.gain >= best_rate_ && ties_ < kMaxTies) {
    from_ = current_;
    ++ties_;
    if (candidate(phase_, cand)) {
      current_ = cand;
      ++probes_;
      return;
    }
  }
  current_ = best_;
  enter(after(phase_, moved_));
}

std::shared_ptr<adaptive_controller> controller_for(dev_t device, io_dir dir, int client, io_shape start,
                                                    const adaptive_limits& limits, double resume_rate) {
  static std::mutex mutex;
  static std::map<std::tuple<dev_t, int, int, bool, bool, std::size_t>, std::shared_ptr<adaptive_controller>>
      controllers;
  std::lock_guard lock(mutex);
  // Pinned coordinates and the request ceiling are part of the key: a controller never serves limits it was
  // not made for.
  auto key = std::make_tuple(device, static_cast<int>(dir), client, limits.depth_fixed, limits.request_fixed,
                             limits.max_request_bytes);
  auto& c = controllers[key];
  if (!c) {
    c = std::make_shared<adaptive_controller>(start, limits);
    if (resume_rate > 0) c->resume(resume_rate);
  }
  return c;
}

}  // namespace gdskit::engine
