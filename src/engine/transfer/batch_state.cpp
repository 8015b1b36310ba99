#include "engine/transfer/batch_state.hpp"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <thread>

#include "common/log.hpp"
#include "engine/thread_pool.hpp"
#include "gdskit/error.hpp"

namespace gdskit::detail {

namespace {
void disarm_deadline(const batch_state* s, batch_state::clock::time_point when);

void run_callback(const std::function<void()>& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    log_warning(std::string("batch completion callback: ") + e.what());
  } catch (...) {
    log_warning("batch completion callback: an exception that is not a std::exception");
  }
}
}  // namespace

batch_state::batch_state(io_direction d, const batch_options& o, std::size_t nranges)
    : dir(d), options(o), decided_(new std::atomic<std::uint8_t>[nranges]()), undecided_(nranges) {
  ranges.reserve(nranges);
  result_.ranges.resize(nranges);
  // Level-triggered readiness for event loops: once written, the counter stays non-zero (nobody reads it).
  event_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_) throw error(errno_code(errno), "eventfd", "", -1, 0, "for a batch's completion descriptor");
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_) throw error(errno_code(errno), "eventfd", "", -1, 0, "for a batch's stop descriptor");
  if (nranges == 0) became_ready();
}

batch_state::~batch_state() = default;

void batch_state::record(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s, std::uint32_t crc) {
  result_.ranges[i] = {nbytes, ec, latency_s, crc};
  decided_[i].store(k_done, std::memory_order_release);
  const std::size_t left = undecided_.fetch_sub(1) - 1;
  if (left == 0) {
    became_ready();
  } else if (left <= wake_at_.load()) {
    std::lock_guard lock(mutex_);  // a waiter between its check and its wait cannot miss this
    cv_.notify_all();
  }
}

bool batch_state::complete(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s, std::uint32_t crc) {
  std::uint8_t expected = k_open;
  if (!decided_[i].compare_exchange_strong(expected, k_claimed, std::memory_order_acq_rel)) return false;
  record(i, nbytes, ec, latency_s, crc);
  return true;
}

bool batch_state::claim(std::size_t i) noexcept {
  std::uint8_t expected = k_open;
  return decided_[i].compare_exchange_strong(expected, k_claimed, std::memory_order_acq_rel);
}

void batch_state::unclaim(std::size_t i) noexcept {
  decided_[i].store(k_open, std::memory_order_release);
  // A deadline or cancel that passed over the range while it was claimed: it completes it now (one of the
  // two gets it: complete_rest sets the stop flag before it walks the ranges). Store then load here, store then
  // load there: only full fences on both sides keep each from missing the other's store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (stopping()) {
    std::error_code ec;
    {
      std::lock_guard lock(mutex_);
      ec = stop_ec_;
    }
    if (ec) complete(i, 0, ec);
  }
}

void batch_state::finish(std::size_t i, std::size_t nbytes, std::error_code ec, double latency_s, std::uint32_t crc) {
  record(i, nbytes, ec, latency_s, crc);
}

std::size_t batch_state::complete_rest(std::error_code ec) {
  {
    std::lock_guard lock(mutex_);
    if (!stop_ec_) stop_ec_ = ec;
  }
  request_stop();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with unclaim()'s
  std::size_t n = 0;
  for (std::size_t i = 0; i < result_.ranges.size() && !ready(); ++i) {
    if (!decided(i) && complete(i, 0, ec)) ++n;
  }
  return n;
}

void batch_state::attach_files() {
  // Ranges of one file mostly come side by side: a copy of the handle only where the file changes.
  for (const auto& r : ranges) {
    if (files_.empty() || files_.back() != r.file) files_.push_back(r.file);
  }
  std::sort(files_.begin(), files_.end());
  files_.erase(std::unique(files_.begin(), files_.end()), files_.end());
  for (const auto& f : files_) {
    std::lock_guard lock(f->async_mutex);
    ++f->async_inflight;
  }
  hold();
}

void batch_state::request_stop() noexcept {
  if (stop_.exchange(true, std::memory_order_acq_rel)) return;
  const std::uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
}

void batch_state::release_hold(std::size_t n) {
  if (holds_.fetch_sub(n, std::memory_order_acq_rel) == n) maybe_released();
}

void batch_state::became_ready() {
  request_stop();
  for (const auto& r : result_.ranges) {
    result_.nbytes += r.nbytes;
    if (r.error) ++result_.failed;
  }
  result_.routes = {routed_host.load(), routed_staged.load(), routed_gds.load(), requests.load(), buffered.load()};
  result_.checksum_mismatches = checksum_mismatches.load();
  result_.seconds = std::chrono::duration<double>(clock::now() - started).count();
  if (options.deadline) disarm_deadline(this, *options.deadline);
  if (on_ready) {
    try {
      on_ready();
    } catch (const std::exception& e) {
      log_warning(std::string("batch completion: ") + e.what());
    }
  }
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    ready_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  const std::uint64_t one = 1;
  if (::write(event_fd_.get(), &one, sizeof one) < 0 && errno != EAGAIN) {
    log_warning("batch completion: eventfd write failed");
  }
  cv_.notify_all();
  maybe_released();
  if (!callbacks.empty()) {
    // A thread of the pool for them while they run: batches completing side by side run their callbacks side
    // by side, as threads waiting on each batch would. Out of memory for that, they run here (late is better
    // than never: a callback may be what ends an operation).
    auto run_all = [](const std::vector<std::function<void()>>& cbs) {
      for (const auto& f : cbs) run_callback(f);
    };
    std::shared_ptr<std::vector<std::function<void()>>> shared;
    try {
      shared = std::make_shared<std::vector<std::function<void()>>>(std::move(callbacks));
    } catch (...) {
      run_all(callbacks);  // not moved from: the allocation failed before the move
    }
    if (shared) {
      try {
        auto hold = std::make_shared<engine::pool_hold>(1);
        engine::shared_pool(1).submit([shared, hold, run_all] { run_all(*shared); });
      } catch (...) {
        run_all(*shared);  // not queued
      }
    }
  }
}

void batch_state::add_callback(std::function<void()> f) {
  {
    std::lock_guard lock(mutex_);
    if (!ready_.load(std::memory_order_acquire)) {
      callbacks_.push_back(std::move(f));
      return;
    }
  }
  run_callback(f);
}

void batch_state::maybe_released() {
  std::lock_guard lock(mutex_);
  if (released_.load(std::memory_order_relaxed)) return;
  if (!ready_.load(std::memory_order_acquire) || holds_.load(std::memory_order_acquire) != 0) return;
  released_.store(true, std::memory_order_release);
  cv_.notify_all();
  for (const auto& f : files_) {
    std::lock_guard flock(f->async_mutex);
    if (--f->async_inflight == 0) f->async_idle.notify_all();
  }
  files_.clear();
}

void batch_state::wait_ready() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return ready_.load(std::memory_order_acquire); });
}

bool batch_state::wait_ready_until(clock::time_point t) const {
  std::unique_lock lock(mutex_);
  return cv_.wait_until(lock, t, [&] { return ready_.load(std::memory_order_acquire); });
}

std::size_t batch_state::wait_undecided_at_most(std::size_t n) const {
  std::unique_lock lock(mutex_);
  // Raised, never lowered: with several waiters the one that wants to hear earliest decides (the others see
  // their count when they wake and wait on).
  std::size_t at = wake_at_.load();
  while (at < n && !wake_at_.compare_exchange_weak(at, n)) {
  }
  cv_.wait(lock, [&] { return ready_.load(std::memory_order_acquire) || undecided_.load() <= n; });
  return ready_.load(std::memory_order_acquire) ? 0 : undecided_.load();
}

void batch_state::wait_released() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return released_.load(std::memory_order_acquire); });
}

namespace {

// One thread for every deadline of the process, started on first use. It sleeps until the earliest deadline
// or a new earlier one. It holds batches by weak reference, and a batch that becomes ready drops its entry.
class deadline_timer {
 public:
  static deadline_timer& instance() {
    static deadline_timer* t = new deadline_timer();  // never destroyed: batches may outlive static destructors
    return *t;
  }

  std::size_t armed() {
    std::lock_guard lock(mutex_);
    return pending_.size();
  }

  void arm(const std::shared_ptr<batch_state>& s, batch_state::clock::time_point when) {
    {
      std::lock_guard lock(mutex_);
      if (!started_) {
        std::thread([this] { run(); }).detach();
        started_ = true;
      }
      pending_.emplace(when, entry{s.get(), s});
    }
    cv_.notify_one();
  }

  // Drops the batch's entry: a batch that completed in time is let go now, not at its deadline (the weak
  // reference alone would keep its memory until then).
  void disarm(const batch_state* s, batch_state::clock::time_point when) {
    std::lock_guard lock(mutex_);
    const auto [first, last] = pending_.equal_range(when);
    for (auto it = first; it != last; ++it) {
      if (it->second.raw == s) {
        pending_.erase(it);
        return;
      }
    }
  }

 private:
  void run() {
    ::pthread_setname_np(::pthread_self(), "gdskit-deadline");
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = pending_.begin();
      if (batch_state::clock::now() < first->first) {
        // A copy: wait_until reads its deadline again after waking, and disarm() may have erased the entry
        // (and its key) while the lock was released.
        const auto until = first->first;
        cv_.wait_until(lock, until);
        continue;
      }
      std::weak_ptr<batch_state> w = first->second.batch;
      pending_.erase(first);
      lock.unlock();
      if (auto s = w.lock(); s && !s->ready()) s->complete_rest(errno_code(ETIMEDOUT));
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  struct entry {
    const batch_state* raw;  // to find the entry (the weak reference may have expired)
    std::weak_ptr<batch_state> batch;
  };
  std::multimap<batch_state::clock::time_point, entry> pending_;
  bool started_ = false;
};

void disarm_deadline(const batch_state* s, batch_state::clock::time_point when) {
  deadline_timer::instance().disarm(s, when);
}

}  // namespace

void arm_deadline(const std::shared_ptr<batch_state>& state, batch_state::clock::time_point when) {
  deadline_timer::instance().arm(state, when);
}

std::size_t armed_deadlines() { return deadline_timer::instance().armed(); }

}  // namespace gdskit::detail
