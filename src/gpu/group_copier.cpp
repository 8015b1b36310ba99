#include "gpu/group_copier.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/idle_pool.hpp"
#include "common/log.hpp"
#include "common/staging_epoch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"
#include "gpu/copy_pieces_ptx.hpp"
#include "gpu/cuda_raii.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {
namespace {

using namespace shim;

// Page-locked host memory (pinned_buffer, which maps it into the devices' address space) with the address the
// device sees it at: staging that the copy engines and the copy kernel both reach. Throws gdskit::error when the
// memory cannot be pinned.
class mapped_chunk {
 public:
  mapped_chunk(std::size_t nbytes, int device) : buf_(nbytes, device) {
    const cuda_api& a = cuda_or_throw();
    gpu::context_guard ctx(device);
    dev_ = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(buf_.data()));
    // With unified addressing the device sees the host address; the driver says so where it can be asked.
    if (a.cuMemHostGetDevicePointer != nullptr && a.cuMemHostGetDevicePointer(&dev_, buf_.data(), 0) != CUDA_SUCCESS) {
      dev_ = 0;  // not mapped: copy engines only
    }
  }

  // Batch drivers' rings may hold this chunk's pages as a registered buffer: they must not take a later mapping
  // at its address for it.
  ~mapped_chunk() { staging_unmapping(); }
  mapped_chunk(const mapped_chunk&) = delete;
  mapped_chunk& operator=(const mapped_chunk&) = delete;

  std::byte* host() const noexcept { return static_cast<std::byte*>(buf_.data()); }
  std::size_t size() const noexcept { return buf_.size(); }
  /// The chunk's address as the device sees it; 0 when it is not mapped.
  CUdeviceptr device_address() const noexcept { return dev_; }

 private:
  pinned_buffer buf_;
  CUdeviceptr dev_ = 0;
};

// Idle pinned chunks per (device, size), kept for the next batch: registering memory costs about a millisecond
// per megabyte, far more than the small reads it stages.
class chunk_pool {
 public:
  static constexpr std::size_t k_idle_cap_bytes = std::size_t{256} << 20;

  static chunk_pool& instance() {
    static chunk_pool* p = new chunk_pool();  // never destroyed: chunks may be returned during exit
    return *p;
  }

  std::unique_ptr<mapped_chunk> take(int device, std::size_t nbytes) {
    if (auto b = idle_.take({device, nbytes})) return std::move(*b);
    return std::make_unique<mapped_chunk>(nbytes, device);
  }

  void give(int device, std::size_t nbytes, std::unique_ptr<mapped_chunk> b) noexcept {
    idle_.give({device, nbytes}, nbytes, std::move(b));
  }

 private:
  idle_pool<std::pair<int, std::size_t>, std::unique_ptr<mapped_chunk>> idle_{k_idle_cap_bytes};
};

// The copy kernel (kernels/copy_pieces.cu) in `device`'s primary context, compiled from its PTX once per process;
// nullptr where the driver cannot load it (no kernel entry points, a driver older than the PTX): the copy
// engines then move every piece. Call with the device's context current.
CUfunction copy_kernel(const cuda_api& a, int device) {
  static std::mutex mutex;
  static std::map<int, CUfunction> loaded;
  std::lock_guard lock(mutex);
  if (auto it = loaded.find(device); it != loaded.end()) return it->second;
  CUfunction f = nullptr;
  if (a.cuModuleLoadData != nullptr) {
    CUmodule module = nullptr;  // kept for the process: the function lives in it
    CUresult r = a.cuModuleLoadData(&module, k_copy_pieces_ptx);
    if (r == CUDA_SUCCESS) r = a.cuModuleGetFunction(&f, module, "gdskit_copy_pieces");
    if (r != CUDA_SUCCESS) {
      f = nullptr;
      log_warning(fmt::format("GPU {}: the copy kernel could not be loaded ({}); small copies go through the copy engines",
                           device, cuda_error_name(r)));
    }
  }
  loaded.emplace(device, f);
  return f;
}

// One piece for the copy kernel, as kernels/copy_pieces.cu reads it: addresses as the device sees them.
struct kernel_piece {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t nbytes;
};
static_assert(sizeof(kernel_piece) == 24);

class cuda_group_copier final : public engine::group_copier {
 public:
  // One table of pieces per launch, in mapped pinned memory the kernel reads.
  static constexpr std::size_t k_table_bytes = std::size_t{64} << 10;
  static constexpr std::size_t k_pieces_per_launch = k_table_bytes / sizeof(kernel_piece);
  static constexpr unsigned k_kernel_threads = 256;

  explicit cuda_group_copier(int device) : device_(device), stream_(device, CU_STREAM_NON_BLOCKING) {
    const cuda_api& a = cuda_or_throw();
    gpu::context_guard ctx(device);
    set_up_landing(a);
    const settings s = default_settings();
    kernel_piece_max_ = s.copy_kernel_bytes;
    if (s.copy_kernel) set_up_kernel(a);
  }

  ~cuda_group_copier() override {
    drain();
    std::lock_guard lock(mutex_);
    for (auto& [ptr, b] : chunks_) chunk_pool::instance().give(device_, b->size(), std::move(b));
    for (auto& t : tables_) chunk_pool::instance().give(device_, k_table_bytes, std::move(t));
    if (word_) chunk_pool::instance().give(device_, k_word_bytes, std::move(word_));
  }

  int device() const override { return device_; }

 private:
  // The word the copy stream writes each group's number into once the group's copies have landed, and the
  // stream the groups' host functions run on, so that the copy stream never waits for one: where the driver
  // has stream memory operations, events and host functions. Without them a group ends by a host function on
  // the copy stream itself, and the next group's copies wait for it to return.
  void set_up_landing(const cuda_api& a) {
    if (a.cuStreamWriteValue64 == nullptr || a.cuStreamWaitEvent == nullptr || a.cuLaunchHostFunc == nullptr ||
        a.cuMemHostGetDevicePointer == nullptr) {
      return;
    }
    std::unique_ptr<mapped_chunk> w;
    try {
      w = chunk_pool::instance().take(device_, k_word_bytes);
      if (w->device_address() != 0) {
        side_ = cuda_stream(device_, CU_STREAM_NON_BLOCKING);
        landed_event_ = cuda_event(device_, CU_EVENT_DISABLE_TIMING);
        // A pooled chunk holds whatever it held last: the count starts again from 0. Drivers may refuse memory
        // operations (a module option on older ones): then no word (nothing was queued).
        landed_word(*w).store(0, std::memory_order_release);
        if (a.cuStreamWriteValue64(stream_.get(), w->device_address(), 0, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS) {
          word_ = std::move(w);
          return;
        }
      }
    } catch (const error&) {
      // Pinning, a stream or an event refused: groups end by host functions on the copy stream.
    }
    side_ = cuda_stream();
    landed_event_ = cuda_event();
    if (w) chunk_pool::instance().give(device_, k_word_bytes, std::move(w));
  }

  static std::atomic_ref<std::uint64_t> landed_word(const mapped_chunk& w) noexcept {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(w.host()));
  }

  void set_up_kernel(const cuda_api& a) {
    kernel_ = copy_kernel(a, device_);
    if (kernel_ == nullptr) return;
    try {
      auto table = chunk_pool::instance().take(device_, k_table_bytes);
      if (table->device_address() == 0) {
        kernel_ = nullptr;  // host memory the device cannot address here: copy engines only
        chunk_pool::instance().give(device_, k_table_bytes, std::move(table));
        return;
      }
      tables_.push_back(std::move(table));
    } catch (const error&) {
      kernel_ = nullptr;  // pinning refused: copy engines only
    }
  }

 public:

  std::byte* take_chunk(std::size_t nbytes) override {
    std::unique_ptr<mapped_chunk> b;
    try {
      b = chunk_pool::instance().take(device_, nbytes);
    } catch (const error&) {
      return nullptr;  // pinning refused (a limit): the driver works with the chunks it has
    }
    std::byte* p = b->host();
    std::lock_guard lock(mutex_);
    chunks_.emplace(p, std::move(b));
    return p;
  }

  void give_chunk(std::byte* chunk, std::size_t nbytes) noexcept override {
    if (auto b = release_chunk(chunk)) chunk_pool::instance().give(device_, nbytes, std::move(b));
  }

  void discard_chunk(std::byte* chunk, std::size_t) noexcept override {
    drain();  // no copy of this copier may still read or write it
    release_chunk(chunk);  // unregistered and unmapped as it goes: the kernel keeps what it pinned
  }

  void add(bool to_device, std::byte* host, std::uintptr_t device_ptr, std::size_t nbytes) override {
    if (kernel_ != nullptr && nbytes <= kernel_piece_max_ && kernel_can_reach(device_ptr, nbytes)) {
      if (const CUdeviceptr h = device_view(host); h != 0) {
        const auto d = static_cast<std::uint64_t>(device_ptr);
        pieces_.push_back(to_device ? kernel_piece{h, d, nbytes} : kernel_piece{d, h, nbytes});
        return;
      }
    }
    auto& q = to_device ? up_ : down_;
    const auto h = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(host));
    q.dst.push_back(to_device ? static_cast<CUdeviceptr>(device_ptr) : h);
    q.src.push_back(to_device ? h : static_cast<CUdeviceptr>(device_ptr));
    q.size.push_back(nbytes);
  }

  void flush(std::uint64_t token, std::function<void(std::uint64_t, std::error_code)> done) override {
    if (up_.size.empty() && down_.size.empty() && pieces_.empty()) return;
    const cuda_api& a = cuda_or_throw();
    std::error_code ec;
    std::vector<std::unique_ptr<mapped_chunk>> used;  // tables the group's launches read
    std::uint64_t seq = 0;                            // nonzero once the group waits in pending_
    try {
      gpu::context_guard ctx(device_);
      issue(a, up_, true);
      issue(a, down_, false);
      launch_pieces(a, used);
      if (a.cuLaunchHostFunc != nullptr) {
        const std::uint64_t next = ++seq_;  // taken even if the group fails: its word write may still land
        if (word_) {
          check_cuda(a.cuStreamWriteValue64(stream_.get(), word_->device_address(), next, CU_STREAM_WRITE_VALUE_DEFAULT),
                     "cuStreamWriteValue64 (copy group landed)");
        }
        {
          std::lock_guard lock(mutex_);
          pending_.push_back({next, token, std::move(done), std::move(used)});
        }
        seq = next;
        // With a landing word the group ends by poll(), or by the host function arm() queues once the driver
        // would sleep: one host function per sleep, not one per group (each costs the driver's thread and
        // CUDA's some microseconds).
        if (word_) return;
        launch_landing_call(a, stream_.get(), seq);
        return;
      }
      // A driver without host functions: wait here (the driver then runs one group at a time).
      const CUresult r = a.cuStreamSynchronize(stream_.get());
      if (r != CUDA_SUCCESS) ec = cuda_code(r);
    } catch (const std::system_error& e) {
      ec = e.code();
    } catch (const std::bad_alloc&) {
      ec = errno_code(ENOMEM);
    }
    if (ec) {
      up_.clear();
      down_.clear();
      pieces_.clear();
      // What went out before a failure may still be reading or writing staging: it ends before the group does.
      drain();
    }
    if (seq != 0) {
      // Its host function did not go out: the group ends here, unless the landing word ended it already (the
      // groups before it have ended: drain() waited for their host functions).
      complete_through(seq, ec);
      return;
    }
    give_tables(std::move(used));
    done(token, ec);
  }

  void arm() noexcept override {
    if (!word_ || armed_ >= seq_) return;
    const cuda_api* a = cuda();
    if (a == nullptr) return;
    try {
      gpu::context_guard ctx(device_);
      // After the newest group on the copy stream; run on the side stream, so that the next group's copies
      // never wait for it to return. It ends every group up to it.
      check_cuda(a->cuEventRecord(landed_event_.get(), stream_.get()), "cuEventRecord (copy groups)");
      check_cuda(a->cuStreamWaitEvent(side_.get(), landed_event_.get(), 0), "cuStreamWaitEvent (copy groups)");
      launch_landing_call(*a, side_.get(), seq_);
      armed_ = seq_;
    } catch (const std::exception& e) {
      // The groups still end by poll(), which the driver calls on every wake and at least every 200 ms; a
      // context that broke shows in failure().
      log_warning(fmt::format("batch copies: no wake-up queued after copy group {}: {}", seq_, e.what()));
    }
  }

  void poll() noexcept override {
    if (!word_) return;
    const std::uint64_t landed = landed_word(*word_).load(std::memory_order_acquire);
    if (landed > completed_.load(std::memory_order_relaxed)) complete_through(landed, {});
  }

  std::error_code failure() noexcept override {
    const cuda_api* a = cuda();
    if (a == nullptr || a->cuStreamQuery == nullptr) return {};
    for (const cuda_stream* s : {&stream_, &side_}) {
      if (!*s) continue;
      const CUresult r = a->cuStreamQuery(s->get());
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) return cuda_code(r);
    }
    return {};
  }

  void drain() noexcept override {
    arm();  // the groups left to poll() end by its host function, which the wait below waits for
    for (const cuda_stream* s : {&stream_, &side_}) {
      if (!*s) continue;
      release_in_context(device_, "cuStreamSynchronize", [h = s->get()] { return cuda()->cuStreamSynchronize(h); });
    }
    poll();  // where arm() could queue nothing: the word shows what landed
  }

 private:
  struct queue {
    std::vector<CUdeviceptr> dst, src;
    std::vector<std::size_t> size;
    void clear() {
      dst.clear();
      src.clear();
      size.clear();
    }
  };

  // The chunk at `chunk`, no longer this copier's (nullptr when it is not one of its chunks).
  std::unique_ptr<mapped_chunk> release_chunk(std::byte* chunk) noexcept {
    std::lock_guard lock(mutex_);
    auto it = chunks_.find(chunk);
    if (it == chunks_.end()) return nullptr;
    if (view_.base == chunk) view_ = {};
    auto b = std::move(it->second);
    chunks_.erase(it);
    return b;
  }

  // Whether the kernel may touch [p, p + n): memory of this device's primary context, inside one allocation
  // the driver knows. A kernel that touched anything else would fault and break the whole context for the
  // process (the copy engines refuse such an address with an error instead), so anything not proven so goes
  // to the engines. Allocations proven once are remembered: a batch's ranges mostly lie in a few.
  bool kernel_can_reach(std::uintptr_t p, std::size_t n) {
    const auto end = static_cast<std::uint64_t>(p) + n;
    for (const auto& [start, stop] : reachable_) {
      if (p >= start && end <= stop) return true;
    }
    const cuda_api* a = cuda();
    if (a == nullptr) return false;
    const auto addr = static_cast<CUdeviceptr>(p);
    CUcontext owner = nullptr;
    CUdeviceptr start = 0;
    std::size_t size = 0;
    unsigned type = 0;
    if (a->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE ||
        a->cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, addr) != CUDA_SUCCESS ||
        a->cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr) != CUDA_SUCCESS ||
        a->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr) != CUDA_SUCCESS) {
      return false;
    }
    if (owner == nullptr || owner != primary_context(device_) || start > addr || end > start + size) return false;
    if (reachable_.size() >= k_reachable_kept) reachable_.erase(reachable_.begin());
    reachable_.emplace_back(start, start + size);
    return true;
  }

  // `host` as the device addresses it: inside a mapped chunk of this copier, else 0. The chunk found last is
  // looked at first, without the lock: a batch's small reads mostly share one chunk, and only the driver's
  // thread adds copies, takes chunks and gives them back.
  CUdeviceptr device_view(std::byte* host) {
    if (host >= view_.base && host < view_.end) return view_.device + static_cast<CUdeviceptr>(host - view_.base);
    std::lock_guard lock(mutex_);
    auto it = chunks_.upper_bound(host);
    if (it == chunks_.begin()) return 0;
    --it;
    const mapped_chunk& c = *it->second;
    if (host >= it->first + c.size() || c.device_address() == 0) return 0;
    view_ = {it->first, it->first + c.size(), c.device_address()};
    return c.device_address() + static_cast<CUdeviceptr>(host - it->first);
  }

  // Every queued copy of one direction in one call where the driver has batched copies, else one call each.
  void issue(const cuda_api& a, queue& q, bool to_device) {
    if (q.size.empty()) return;
    CUresult r = CUDA_SUCCESS;
    if (a.cuMemcpyBatchAsync != nullptr && q.size.size() > 1) {
      CUmemcpyAttributes attr{};
      attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
      std::size_t first = 0;
      r = a.cuMemcpyBatchAsync(q.dst.data(), q.src.data(), q.size.data(), q.size.size(), &attr, &first, 1, stream_.get());
    } else {
      for (std::size_t i = 0; i < q.size.size() && r == CUDA_SUCCESS; ++i) {
        r = to_device ? a.cuMemcpyHtoDAsync(q.dst[i], reinterpret_cast<const void*>(q.src[i]), q.size[i], stream_.get())
                      : a.cuMemcpyDtoHAsync(reinterpret_cast<void*>(q.dst[i]), q.src[i], q.size[i], stream_.get());
      }
    }
    q.clear();
    check_cuda(r, to_device ? "cuMemcpyBatchAsync (host to device)" : "cuMemcpyBatchAsync (device to host)");
  }

  // The kernel's pieces, one launch per table of them; the tables used are added to `used`.
  void launch_pieces(const cuda_api& a, std::vector<std::unique_ptr<mapped_chunk>>& used) {
    std::size_t first = 0;
    while (first < pieces_.size()) {
      const std::size_t n = std::min(pieces_.size() - first, k_pieces_per_launch);
      used.push_back(take_table());
      std::memcpy(used.back()->host(), pieces_.data() + first, n * sizeof(kernel_piece));
      CUdeviceptr table = used.back()->device_address();
      unsigned count = static_cast<unsigned>(n);
      void* params[] = {&table, &count};
      const CUresult r = a.cuLaunchKernel(kernel_, static_cast<unsigned>(n), 1, 1, k_kernel_threads, 1, 1, 0,
                                          stream_.get(), params, nullptr);
      check_cuda(r, "cuLaunchKernel (copy pieces)");
      first += n;
    }
    pieces_.clear();
  }

  std::unique_ptr<mapped_chunk> take_table() {
    {
      std::lock_guard lock(mutex_);
      if (!tables_.empty()) {
        auto t = std::move(tables_.back());
        tables_.pop_back();
        return t;
      }
    }
    auto t = chunk_pool::instance().take(device_, k_table_bytes);
    if (t->device_address() == 0) throw error(errno_code(EFAULT), "copy kernel: pinned memory the GPU cannot address");
    return t;
  }

  void give_tables(std::vector<std::unique_ptr<mapped_chunk>> tables) noexcept {
    try {
      std::lock_guard lock(mutex_);
      for (auto& t : tables) tables_.push_back(std::move(t));
    } catch (...) {
    }
  }

  // A flushed group until its `done` is called: by poll() once the landing word shows it, or by the host
  // function queued after it, whichever comes first.
  struct pending_group {
    std::uint64_t seq;
    std::uint64_t token;
    std::function<void(std::uint64_t, std::error_code)> done;
    std::vector<std::unique_ptr<mapped_chunk>> tables;  // piece tables its launches read
  };

  struct landing_call {
    cuda_group_copier* copier;
    std::uint64_t seq;
  };

  // Queues on `stream` a host function that ends every group up to number `seq`.
  void launch_landing_call(const cuda_api& a, CUstream stream, std::uint64_t seq) {
    auto call = std::make_unique<landing_call>(landing_call{this, seq});
    check_cuda(a.cuLaunchHostFunc(stream, run_landing_call, call.get()), "cuLaunchHostFunc (copy group)");
    call.release();
  }

  static void run_landing_call(void* p) {
    std::unique_ptr<landing_call> c(static_cast<landing_call*>(p));
    c->copier->complete_through(c->seq, {});
  }

  // Ends every pending group up to number `seq` (they have landed, or failed with `ec`): their tables go back
  // for the next launches, in the same hold of the lock, and their `done` is called, on this thread.
  void complete_through(std::uint64_t seq, std::error_code ec) noexcept {
    std::vector<pending_group> ready;
    try {
      std::lock_guard lock(mutex_);
      while (!pending_.empty() && pending_.front().seq <= seq) {
        ready.push_back(std::move(pending_.front()));
        pending_.pop_front();
        for (auto& t : ready.back().tables) tables_.push_back(std::move(t));
      }
      if (seq > completed_.load(std::memory_order_relaxed)) completed_.store(seq, std::memory_order_relaxed);
    } catch (const std::bad_alloc&) {
      // The groups taken so far end below; the rest by their host functions. A table not kept is unpinned.
    }
    for (pending_group& g : ready) {
      try {
        g.done(g.token, ec);
      } catch (...) {
        log_warning("batch copy completion: the callback threw");
      }
    }
  }

  static constexpr std::size_t k_word_bytes = 4096;

  int device_;
  cuda_stream stream_;
  cuda_stream side_;                     // the host functions arm() queues, where there is a landing word
  cuda_event landed_event_;              // orders side_ after the newest group when arm() queues one
  std::unique_ptr<mapped_chunk> word_;   // the landing word (its first 8 bytes), or none
  std::uint64_t seq_ = 0;                // groups flushed (the number of the last one)
  std::uint64_t armed_ = 0;              // groups up to this number end by a host function queued by arm()
  std::atomic<std::uint64_t> completed_{0};  // groups up to this number have ended
  std::deque<pending_group> pending_;    // under mutex_
  CUfunction kernel_ = nullptr;  // the copy kernel, where small pieces go to it
  // The largest piece it moves (the copy_kernel_bytes setting): larger ones go to the copy engines, which cost
  // the CPU some microseconds each (the driver's own work per operation) and no GPU cores.
  std::size_t kernel_piece_max_ = 0;
  queue up_, down_;
  std::vector<kernel_piece> pieces_;
  static constexpr std::size_t k_reachable_kept = 16;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reachable_;  // allocations proven for the kernel
  struct chunk_view {
    std::byte* base = nullptr;
    std::byte* end = nullptr;
    CUdeviceptr device = 0;
  };
  chunk_view view_;  // the chunk device_view() found last (the driver's thread only)
  std::mutex mutex_;
  std::map<std::byte*, std::unique_ptr<mapped_chunk>> chunks_;
  std::vector<std::unique_ptr<mapped_chunk>> tables_;  // idle piece tables
};

}  // namespace

std::unique_ptr<engine::group_copier> make_cuda_group_copier(int device) {
  return std::make_unique<cuda_group_copier>(device);
}

}  // namespace gdskit::gpu
