#include "engine/adaptive.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "engine/device_profile.hpp"
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
  // The first requests of a controller's life measure the device's start-up (metadata read after a cache drop,
  // queues filling, threads starting), not the start shape.
  settle_ = static_cast<std::size_t>(start.depth) * start.request_bytes;
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
  if (limits_.recheck_windows > 0) recheck_due_ = std::max(1u, limits_.recheck_windows / 2);
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

unsigned adaptive_controller::drift_searches() const {
  std::lock_guard lock(mutex_);
  return drift_searches_;
}

unsigned adaptive_controller::rechecks() const {
  std::lock_guard lock(mutex_);
  return rechecks_;
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
  if (--active_ == 0) {
    window_s_ += now_s - active_since_;
    if (closing_) close_window();
  }
}

std::size_t adaptive_controller::window_bytes() const {
  const std::size_t full =
      std::max(limits_.min_window_bytes, 2 * static_cast<std::size_t>(current_.depth) * current_.request_bytes);
  // The start is measured in two half windows (one window's bytes in all): the pair is also a noise sample.
  return phase_ == phase::measure_start ? full / 2 : full;
}

double adaptive_controller::margin() const {
  // Twice the measured noise (the mean relative gap between two windows of one shape), and never less than the
  // configured gain: on a quiet machine 5% decides, on a loaded one only a difference the noise cannot make.
  // Few samples say little: they are weighed against a prior of half the gain, as two samples would be.
  const double prior = (limits_.gain - 1.0) / 2;
  const double n = std::min(noise_samples_, 8u);
  const double noise = (n * noise_ + 2 * prior) / (n + 2);
  return std::max(limits_.gain, 1.0 + 2.0 * noise);
}

double adaptive_controller::needed(io_shape cand) const {
  // (Larger requests get no discount: a candidate that won on a tie would end the size search before the
  // smaller sizes were measured.)
  const double halvings =
      std::log2(static_cast<double>(best_.request_bytes) / static_cast<double>(cand.request_bytes));
  return margin() * std::pow(limits_.smaller_request_gain, std::max(0.0, halvings));
}

double adaptive_controller::drift_tolerance() const {
  // The drift margin, or twice the measured noise where that is larger, but never more than half the rate: a
  // device that halves its rate is always noticed.
  return std::max(limits_.drift, std::min(2 * noise_, 0.5));
}

double adaptive_controller::batch_gap(double mean_interval) const {
  // Completions are reaped in batches, stamped microseconds apart: a completion that follows the last one by
  // less than a quarter of the mean interval between completions (and never less than 25 us) is of the same
  // batch.
  return std::max(25e-6, mean_interval / 4);
}

void adaptive_controller::complete(std::size_t nbytes, double now_s, std::size_t request_bytes) {
  std::lock_guard lock(mutex_);
  const auto of_measured_size = [&] { return request_bytes == 0 || request_bytes == current_.request_bytes; };
  if (closing_) {
    // A window ends after the last completion of the batch that filled it, or its end would be off by part of a
    // batch (up to the bytes in flight).
    // (A completion stamped before the last one, by a thread that then waited for the lock, adds no time.)
    const double gap = std::max(0.0, now_s - close_at_);
    if (of_measured_size() && batch_left_ > 0 &&
        gap <= batch_gap(close_s_ / static_cast<double>(std::max<std::size_t>(window_count_, 1)))) {
      --batch_left_;
      window_bytes_ += nbytes;
      ++window_count_;
      close_s_ += gap;
      close_at_ += gap;
      return;
    }
    close_window();
    if (!(current_ == measured_) && settle_ == 0) {
      // The window just closed moved the shape: this completion, and its batch, were issued under the old one.
      stale_ = true;
    }
  }
  if (settle_ > 0) {
    // Requests issued under the previous shape are still completing: they measure neither shape.
    settle_ -= std::min(settle_, nbytes);
    if (settle_ == 0) stale_ = true;
    return;
  }
  if (!of_measured_size()) {  // (the window just closed may have changed the size)
    stale_ = true;
    return;
  }
  if (stale_) {
    // The time so far went to requests of another size or shape: the next window starts after this completion's
    // batch (a window that started inside it would count the rest of the batch in no time).
    stale_ = false;
    restarting_ = true;
    restart_at_ = now_s;
    batch_left_ = std::max(current_.depth, measured_.depth);  // requests of the last shape may still be in flight
    return;
  }
  if (restarting_) {
    if (batch_left_ > 0 && now_s - restart_at_ <= batch_gap(last_interval_)) {
      --batch_left_;
      restart_at_ = std::max(restart_at_, now_s);
      return;
    }
    restarting_ = false;
    window_bytes_ = 0;
    window_count_ = 0;
    window_s_ = 0;
    // A transfer that began after the restart point starts the time (idle time between transfers never counts).
    active_since_ = std::max(active_since_, restart_at_);
  }
  window_bytes_ += nbytes;
  ++window_count_;
  if (window_bytes_ < window_bytes()) return;
  const double seconds = window_s_ + (active_ > 0 ? now_s - active_since_ : 0.0);
  if (seconds < limits_.min_window_s || seconds <= 0) return;
  closing_ = true;
  close_at_ = now_s;
  close_s_ = seconds;
  batch_left_ = current_.depth;  // a batch holds at most the requests in flight
}

void adaptive_controller::close_window() {
  closing_ = false;
  const double rate = static_cast<double>(window_bytes_) / close_s_;
  last_interval_ = close_s_ / static_cast<double>(std::max<std::size_t>(window_count_, 1));
  window_bytes_ = 0;
  window_count_ = 0;
  window_s_ = 0;
  active_since_ = close_at_;
  const io_shape before = current_;
  judge(rate);
  // After a cut in depth the queue drains to the new depth first: the completions of the requests above it ran
  // at the old depth. (A deeper queue fills at once; requests of another size are skipped as stale.)
  if (active_ > 0 && current_.request_bytes == before.request_bytes && current_.depth < before.depth) {
    settle_ = static_cast<std::size_t>(before.depth - current_.depth) * before.request_bytes;
  }
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
    confirming_ = false;
    reference_ = false;
    if (p == phase::hold) {
      current_ = best_;
      converged_rate_ = best_rate_;
      drift_windows_ = 0;
      held_windows_ = 0;
      if (limits_.recheck_windows > 0) {
        // A check that found nothing better makes the next one rarer; a shape that moved is checked as often
        // as a new one.
        const unsigned most = limits_.recheck_windows * 16;
        recheck_due_ = rechecking_ && best_ == recheck_from_
                           ? std::min(most, std::max(recheck_due_ * 2, limits_.recheck_windows))
                           : limits_.recheck_windows;
      }
      rechecking_ = false;
      return;
    }
    io_shape cand;
    if (candidate(p, cand)) {
      ++probes_;
      if (measured_ == best_ || close_at_ - best_at_ <= 3 * close_s_) {
        current_ = cand;
      } else {
        // The incumbent was last measured more than a few windows ago (a walk over ties since): it is measured
        // again first, so the next candidate is compared with a rate of the same moment, not one from before the
        // device wandered.
        current_ = best_;
        next_ = cand;
        reference_ = true;
      }
      return;
    }
    p = after(p, false);
  }
}

void adaptive_controller::judge(double rate) {
  const bool incumbent_just_measured = measured_ == best_;
  const double prev_rate = last_rate_;
  // A held shape tests each window against the noise known before it: a step in the device's rate must not
  // first raise the noise and so hide itself. Windows that drift do not count as noise samples.
  // The held rate is compared with the mean of the last two windows of the shape, so noise that alternates
  // window by window neither triggers a search nor hides a step.
  const bool pair = phase_ == phase::hold && measured_ == current_ && last_rate_ > 0;
  const double held = pair ? (rate + last_rate_) / 2 : rate;
  const bool drifted = phase_ == phase::hold && std::fabs(held / converged_rate_ - 1.0) > drift_tolerance();
  if (measured_ == current_ && last_rate_ > 0 && !drifted) {
    // Two windows in a row of one shape: how far apart they are is the machine's noise (an average over such
    // pairs), which sets the margin a candidate must win by.
    const double d = std::fabs(rate - last_rate_) / ((rate + last_rate_) / 2);
    noise_ = noise_samples_++ == 0 ? d : 0.75 * noise_ + 0.25 * d;
  }
  last_rate_ = rate;
  measured_ = current_;
  if (current_ == best_) best_at_ = close_at_;
  if (phase_ == phase::measure_start) {
    // Two windows (after the start-up, see the constructor): their mean is the start rate, their difference the
    // first noise sample.
    if (noise_samples_ == 0) return;
    best_rate_ = (rate + prev_rate) / 2;
    enter(after(phase_, false));
    return;
  }
  if (reference_) {
    reference_ = false;
    best_rate_ = rate;
    current_ = next_;
    return;
  }
  if (phase_ == phase::hold) {
    if (!drifted) {
      drift_windows_ = 0;
      converged_rate_ = 0.9 * converged_rate_ + 0.1 * rate;
      if (recheck_due_ > 0 && ++held_windows_ >= recheck_due_) {
        // The held shape's neighbours are measured again, against the held shape's last two windows.
        ++rechecks_;
        rechecking_ = true;
        recheck_from_ = best_;
        search_again(held);
      }
      return;
    }
    if (++drift_windows_ < 2) return;
    // The device changed under us (another tenant, its cache, a different region): the old comparisons are
    // stale, so the incumbent's rate is taken as measured now and the search starts again from it.
    ++drift_searches_;
    search_again(rate);
    return;
  }
  if (confirming_) {
    // This window measured the incumbent again, after the candidate: the candidate must beat the better of the
    // incumbent's windows before and after it, so a rate that only rose with time (or a slow start) does not
    // pass for a better shape.
    confirming_ = false;
    const double before = best_rate_;
    best_rate_ = rate;
    decide(first_rate_, std::max(before, rate), next_);
    return;
  }
  // A candidate whose window beats the incumbent could have been lucky or carried by a rising rate: unless it
  // wins by what it needs times the margin against an incumbent measured in the window just before, the
  // incumbent is measured once more before the verdict.
  const double need = needed(current_);
  const bool clear = rate > best_rate_ * need * margin() && incumbent_just_measured;
  if (rate > best_rate_ * need && !clear) {
    confirming_ = true;
    first_rate_ = rate;
    next_ = current_;
    current_ = best_;
    return;
  }
  decide(rate, best_rate_, current_);
}

void adaptive_controller::search_again(double rate) {
  resumed_ = false;
  best_rate_ = rate;
  best_at_ = close_at_;
  rounds_ = 0;
  size_moved_ = false;
  enter(phase::depth_up);
}

void adaptive_controller::decide(double rate, double incumbent_rate, io_shape cand_shape) {
  io_shape cand;
  const double m = margin();
  if (rate > incumbent_rate * needed(cand_shape)) {
    best_ = from_ = cand_shape;
    best_rate_ = rate;
    best_at_ = close_at_;
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
  if (rate * m >= incumbent_rate && ties_ < kMaxTies) {
    from_ = cand_shape;
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
  static std::map<std::tuple<std::string, dev_t, int, int, bool, bool, std::size_t>,
                  std::shared_ptr<adaptive_controller>>
      controllers;
  // Pinned coordinates and the request ceiling are part of the key: a controller never serves limits it was
  // not made for. So is the profile folder, as for the profiles it starts from: a process that points
  // XDG_CACHE_HOME elsewhere starts from that folder's shapes, not from what it learned under the first.
  auto key = std::make_tuple(profile_dir().string(), device, static_cast<int>(dir), client, limits.depth_fixed,
                             limits.request_fixed, limits.max_request_bytes);
  std::lock_guard lock(mutex);
  auto& c = controllers[key];
  if (!c) {
    c = std::make_shared<adaptive_controller>(start, limits);
    if (resume_rate > 0) c->resume(resume_rate);
  }
  return c;
}

}  // namespace gdskit::engine
