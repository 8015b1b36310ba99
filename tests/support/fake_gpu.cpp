#include "fake_gpu.hpp"

#include <sys/mman.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/staging_epoch.hpp"
#include "gdskit/error.hpp"

namespace gdskit::test {
namespace {

// Addresses of every staging chunk the fake copiers mapped, over the process.
std::mutex& addresses_mutex() {
  static std::mutex m;
  return m;
}
std::set<void*>& addresses() {
  static std::set<void*> a;
  return a;
}

class late_copier final : public engine::group_copier {
 public:
  late_copier(copier_stats& s, std::chrono::milliseconds delay, std::error_code fail, bool dead = false,
              fake_landing landing = {})
      : s_(s), delay_(delay), fail_(fail), dead_(dead), landing_(landing), worker_([this] { work(); }),
        notifier_([this] { notify(); }) {}
  ~late_copier() override {
    drain();
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    notifier_.join();
  }
  int device() const override { return 0; }
  // Each chunk a mapping of its own, unmapped when given back, as a copier without a pool would: the next one
  // often gets the same address with other pages, which a driver must not take for the chunk it entered in its
  // ring's table before.
  std::byte* take_chunk(std::size_t n) override {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    ++s_.live_chunks;
    {
      std::lock_guard lock(addresses_mutex());
      if (!addresses().insert(p).second) ++s_.chunks_at_old_addresses;
    }
    return static_cast<std::byte*>(p);
  }
  void give_chunk(std::byte* c, std::size_t n) noexcept override {
    --s_.live_chunks;
    staging_unmapping();
    ::munmap(c, n);
  }
  void add(bool to_device, std::byte* host, std::uintptr_t dev, std::size_t n) override {
    queued_.push_back({to_device, host, dev, n});
  }
  void flush(std::uint64_t token, std::function<void(std::uint64_t, std::error_code)> done) override {
    if (queued_.empty()) return;
    if (s_.on_flush) s_.on_flush();
    if (s_.on_group) {
      std::size_t bytes = 0;
      for (const auto& c : queued_) bytes += c.n;
      s_.on_group(in_flight_.load(), bytes);
    }
    ++s_.groups;
    s_.copies += static_cast<int>(queued_.size());
    if (static_cast<int>(queued_.size()) > s_.largest_group) s_.largest_group = static_cast<int>(queued_.size());
    if (dead_) {
      queued_.clear();  // taken, never run: `done` is not called
      broke_ = true;
      return;
    }
    {
      std::lock_guard lock(m_);
      const std::uint64_t seq = ++seq_;
      if (landing_.at_flush) {
        if (!fail_) land(queued_);
        if (landing_.word && !fail_) landed_.store(seq, std::memory_order_release);
        queued_.clear();
      }
      jobs_.push_back({std::move(queued_), seq, std::chrono::steady_clock::now() + delay_});
      waiting_.push_back({seq, token, std::move(done)});
      ++pending_;
      // Groups not yet landed: a group has landed once its callback is called, as a host function on a CUDA
      // stream runs after the copies before it.
      const int in_flight = ++in_flight_;
      if (in_flight > s_.most_pending) s_.most_pending = in_flight;
    }
    queued_.clear();
    cv_.notify_all();
  }
  void drain() noexcept override {
    arm();
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }
  void arm() noexcept override {
    {
      std::lock_guard lock(m_);
      if (armed_ >= seq_) return;
      armed_ = seq_;
    }
    ++s_.arms;
    cv_.notify_all();
  }
  std::error_code failure() noexcept override { return broke_ ? fail_ : std::error_code{}; }
  void poll() noexcept override {
    if (!landing_.word) return;
    end_through(landed_.load(std::memory_order_acquire), s_.polled);
  }

 private:
  struct copy {
    bool to_device;
    std::byte* host;
    std::uintptr_t dev;
    std::size_t n;
  };
  struct job {
    std::vector<copy> copies;
    std::uint64_t seq;
    std::chrono::steady_clock::time_point at;
  };
  struct group {
    std::uint64_t seq;
    std::uint64_t token;
    std::function<void(std::uint64_t, std::error_code)> done;
  };
  static void land(const std::vector<copy>& copies) {
    for (const auto& c : copies) {
      if (c.to_device) {
        std::memcpy(reinterpret_cast<void*>(c.dev), c.host, c.n);
      } else {
        std::memcpy(c.host, reinterpret_cast<const void*>(c.dev), c.n);
      }
    }
  }
  // Ends the groups up to `seq` not ended yet, on this thread, counting them in `by` before each ends (the
  // batch may be over, and the test reading the counts, the moment the last one's `done` returns).
  void end_through(std::uint64_t seq, std::atomic<int>& by) {
    std::vector<group> ready;
    {
      std::lock_guard lock(m_);
      while (!waiting_.empty() && waiting_.front().seq <= seq) {
        ready.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    for (group& g : ready) {
      --in_flight_;
      ++by;
      g.done(g.token, fail_);
      std::lock_guard lock(m_);
      --pending_;
    }
    cv_.notify_all();
  }
  // The callbacks: each group's, `callback_after` after it landed (at once on stop).
  void notify() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !callbacks_.empty(); });
      if (callbacks_.empty()) return;
      const auto [seq, at] = callbacks_.front();
      if (!stop_ && std::chrono::steady_clock::now() < at) {
        cv_.wait_until(lock, at);
        continue;
      }
      if (!stop_ && landing_.callbacks_when_armed && seq > armed_) {
        cv_.wait(lock);  // arm() or stop
        continue;
      }
      callbacks_.pop_front();
      lock.unlock();
      end_through(seq, s_.called_back);
      lock.lock();
    }
  }
  void work() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job j = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(j.at);
      if (!fail_) land(j.copies);
      if (landing_.word && !fail_) landed_.store(j.seq, std::memory_order_release);
      lock.lock();
      callbacks_.emplace_back(j.seq, std::chrono::steady_clock::now() + landing_.callback_after);
      cv_.notify_all();
    }
  }
  copier_stats& s_;
  std::chrono::milliseconds delay_;
  std::error_code fail_;
  bool dead_;
  std::atomic<bool> broke_{false};
  std::vector<copy> queued_;
  std::mutex m_;
  std::condition_variable cv_;
  fake_landing landing_;
  std::deque<job> jobs_;
  std::deque<group> waiting_;        // flushed, not yet ended
  std::deque<std::pair<std::uint64_t, std::chrono::steady_clock::time_point>> callbacks_;
  std::uint64_t seq_ = 0;
  std::uint64_t armed_ = 0;          // groups up to this number get their callback (callbacks_when_armed)
  std::atomic<std::uint64_t> landed_{0};  // the landing word
  int pending_ = 0;                  // flushed, not yet ended (drain waits for these)
  std::atomic<int> in_flight_{0};    // flushed, `done` not yet called
  bool stop_ = false;
  std::thread worker_;
  std::thread notifier_;
};

class fake_backend final : public engine::gpu_backend {
 public:
  fake_backend(copier_stats& s, std::chrono::milliseconds delay, std::error_code fail, bool dead = false,
               fake_landing landing = {})
      : s_(s), delay_(delay), fail_(fail), dead_(dead), landing_(landing) {}
  std::unique_ptr<engine::copier_lease> lease_lanes(int, unsigned, unsigned, std::size_t) override {
    throw error(errno_code(ENOTSUP), "not in this test");
  }
  std::size_t cufile_transfer(const engine::open_file&, bool, buffer_view, std::size_t, std::uint64_t) override {
    throw error(errno_code(ENOTSUP), "not in this test");
  }
  bool cufile_batch(std::span<const engine::cufile_entry>, const std::function<bool()>&,
                    const std::function<void(std::size_t, std::size_t, std::error_code)>&) override {
    return false;
  }
  std::unique_ptr<engine::group_copier> make_group_copier(int) override {
    if (dead_) return std::make_unique<late_copier>(s_, delay_, fail_, true);
    return std::make_unique<late_copier>(s_, delay_, fail_, false, landing_);
  }
  std::function<void()> stream_gate(void*, int) override { throw error(errno_code(ENOTSUP), "not in this test"); }
  void when_stream_reaches(void*, int, std::function<void()>) override {
    throw error(errno_code(ENOTSUP), "not in this test");
  }

 private:
  copier_stats& s_;
  std::chrono::milliseconds delay_;
  std::error_code fail_;
  bool dead_;
  fake_landing landing_;
};

}  // namespace

std::unique_ptr<engine::gpu_backend> make_fake_gpu(copier_stats& stats, std::chrono::milliseconds delay,
                                                   std::error_code fail, fake_landing landing) {
  return std::make_unique<fake_backend>(stats, delay, fail, false, landing);
}

std::unique_ptr<engine::gpu_backend> make_dead_gpu(copier_stats& stats, std::error_code broken) {
  return std::make_unique<fake_backend>(stats, std::chrono::milliseconds(0), broken, true);
}

}  // namespace gdskit::test
