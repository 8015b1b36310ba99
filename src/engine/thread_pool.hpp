// A process-wide pool of worker threads. Jobs never wait on other jobs: callers that fan work out also run
// it themselves (see parallel_for), so a job submitted from a worker cannot deadlock the pool.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gdskit::engine {

class thread_pool {
 public:
  explicit thread_pool(unsigned nthreads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  void submit(std::function<void()> job);
  /// Grows the pool to at least `nthreads` workers (it never shrinks).
  void ensure_threads(unsigned nthreads);
  unsigned size() const;

 private:
  void work();

  // A worker waiting for a job, on its own stack.
  struct waiter {
    std::condition_variable cv;
    bool woken = false;
  };

  mutable std::mutex mutex_;
  // Idle workers, the one idle the shortest at the back: a job wakes that one, so that work submitted one job
  // after another keeps to the same few threads (their caches, and a batch driver's io_uring ring with its
  // registered staging, stay warm) instead of going round every thread the pool ever grew to.
  std::vector<waiter*> idle_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

/// The shared pool, grown on demand.
thread_pool& shared_pool(unsigned min_threads);

/// Threads of the shared pool held for long by jobs that block (a batch driver for its batch's life, a thread
/// engine's workers). While held, the pool keeps a thread for each, and one more for short jobs, so that work
/// side by side runs side by side instead of queueing behind the jobs that hold threads (past a cap of 512
/// threads they share). Take it before submitting the job and keep it until the job ends. Move-only.
class pool_hold {
 public:
  pool_hold() noexcept = default;
  explicit pool_hold(unsigned threads);
  ~pool_hold();
  pool_hold(pool_hold&& o) noexcept;
  pool_hold& operator=(pool_hold&& o) noexcept;
  pool_hold(const pool_hold&) = delete;
  pool_hold& operator=(const pool_hold&) = delete;

 private:
  unsigned threads_ = 0;
};

/// Runs body(i) for i in [0, n) on up to `parallelism` threads, the caller being one of them. Returns when
/// every index has run. The first exception thrown stops handing out new indices and is rethrown.
void parallel_for(std::size_t n, unsigned parallelism, const std::function<void(std::size_t)>& body);

}  // namespace gdskit::engine
