#include "engine/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <system_error>
#include <utility>

namespace gdskit::engine {

thread_pool::thread_pool(unsigned nthreads) { ensure_threads(nthreads); }

thread_pool::~thread_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (waiter* w : idle_) w->cv.notify_one();  // each takes itself off the list as it wakes
  }
  for (auto& t : workers_) t.join();
}

void thread_pool::submit(std::function<void()> job) {
  std::lock_guard lock(mutex_);
  jobs_.push_back(std::move(job));
  if (!idle_.empty()) {
    // Under the lock: the waiter lives on its worker's stack, which a worker past the lock may leave.
    waiter* w = idle_.back();
    idle_.pop_back();
    w->woken = true;
    w->cv.notify_one();
  }
}

void thread_pool::ensure_threads(unsigned nthreads) {
  std::lock_guard lock(mutex_);
  while (workers_.size() < nthreads) workers_.emplace_back([this] { work(); });
}

unsigned thread_pool::size() const {
  std::lock_guard lock(mutex_);
  return static_cast<unsigned>(workers_.size());
}

void thread_pool::work() {
  // Named, so top -H, perf and /proc/PID/task tell gdskit's workers from the application's and the driver's.
  ::pthread_setname_np(::pthread_self(), "gdskit-worker");
  waiter me;
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      while (!stopping_ && jobs_.empty()) {
        me.woken = false;
        idle_.push_back(&me);
        me.cv.wait(lock, [&] { return me.woken || stopping_; });
        // A worker that was not handed a job takes itself off the list (the others were taken off by submit):
        // a job another worker took first leaves this one to wait again.
        if (!me.woken) idle_.erase(std::find(idle_.begin(), idle_.end(), &me));
      }
      if (jobs_.empty()) return;  // stopping and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

thread_pool& shared_pool(unsigned min_threads) {
  // Never destroyed, like the deadline thread that completes batches: a batch may end after static destructors
  // ran (a deadline at exit), and its callbacks are then still handed to this pool. Exit does not wait for jobs
  // that a request the kernel holds keeps busy.
  static thread_pool* pool = new thread_pool(0);
  if (pool->size() < min_threads) pool->ensure_threads(min_threads);
  return *pool;
}

namespace {

std::atomic<unsigned>& held_threads() {
  static std::atomic<unsigned> n{0};
  return n;
}

// A thousand batches at once must not start tens of thousands of threads: past this, held jobs share.
constexpr unsigned k_most_pool_threads = 512;

}  // namespace

pool_hold::pool_hold(unsigned threads) : threads_(threads) {
  const unsigned held = held_threads().fetch_add(threads) + threads;
  try {
    shared_pool(std::min(held + 1, k_most_pool_threads));
  } catch (...) {
    // No thread to be had (a process limit, no memory): held jobs share the threads the pool has, if any.
    if (shared_pool(0).size() == 0) {
      held_threads().fetch_sub(threads);
      throw;
    }
  }
}

pool_hold::~pool_hold() {
  if (threads_ != 0) held_threads().fetch_sub(threads_);
}

pool_hold::pool_hold(pool_hold&& o) noexcept : threads_(std::exchange(o.threads_, 0)) {}

pool_hold& pool_hold::operator=(pool_hold&& o) noexcept {
  if (this != &o) {
    if (threads_ != 0) held_threads().fetch_sub(threads_);
    threads_ = std::exchange(o.threads_, 0);
  }
  return *this;
}

void parallel_for(std::size_t n, unsigned parallelism, const std::function<void(std::size_t)>& body) {
  if (n == 0) return;
  if (parallelism <= 1 || n == 1) {
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct state {
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> finished{0};
    std::atomic<bool> failed{false};
    std::mutex mutex;
    std::condition_variable cv;
    std::exception_ptr error;
    std::size_t n = 0;
    const std::function<void(std::size_t)>* body = nullptr;
  };
  auto st = std::make_shared<state>();
  st->n = n;
  st->body = &body;
  // Helpers hold the state alive; they only touch `body` while an index remains, and the caller does not
  // return before every index has finished, so `body` outlives every call.
  auto drain = [](const std::shared_ptr<state>& s) {
    for (;;) {
      std::size_t i = s->next.fetch_add(1);
      if (i >= s->n) return;
      if (!s->failed.load(std::memory_order_relaxed)) {
        try {
          (*s->body)(i);
        } catch (...) {
          std::lock_guard lock(s->mutex);
          if (!s->error) s->error = std::current_exception();
          s->failed = true;
        }
      }
      if (s->finished.fetch_add(1) + 1 == s->n) {
        std::lock_guard lock(s->mutex);
        s->cv.notify_all();
      }
    }
  };
  unsigned helpers = static_cast<unsigned>(std::min<std::size_t>(parallelism, n)) - 1;
  // The helpers block for the loop's length: threads held by others (batch drivers) must not keep them queued.
  const pool_hold hold(helpers);
  auto& pool = shared_pool(1);
  for (unsigned h = 0; h < helpers; ++h) pool.submit([st, drain] { drain(st); });
  drain(st);
  std::unique_lock lock(st->mutex);
  st->cv.wait(lock, [&] { return st->finished.load() == st->n; });
  if (st->error) std::rethrow_exception(st->error);
}

}  // namespace gdskit::engine
