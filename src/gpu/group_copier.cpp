#include "gpu/group_copier.hpp"

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "gdskit/error.hpp"
#include "gpu/cuda_raii.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {
namespace {

using namespace shim;

// Idle pinned chunks per (device, size), kept for the next batch: registering memory costs about a millisecond
// per megabyte, far more than the small reads it stages.
class chunk_pool {
 public:
  static constexpr std::size_t k_idle_cap_bytes = std::size_t{256} << 20;

  static chunk_pool& instance() {
    static chunk_pool* p = new chunk_pool();  // never destroyed: chunks may be returned during exit
    return *p;
  }

  std::unique_ptr<pinned_buffer> take(int device, std::size_t nbytes) {
    {
      std::lock_guard lock(mutex_);
      auto& v = idle_[{device, nbytes}];
      if (!v.empty()) {
        auto b = std::move(v.back());
        v.pop_back();
        idle_bytes_ -= nbytes;
        return b;
      }
    }
    return std::make_unique<pinned_buffer>(nbytes, device);
  }

  void give(int device, std::unique_ptr<pinned_buffer> b) noexcept {
    try {
      std::lock_guard lock(mutex_);
      if (idle_bytes_ + b->size() > k_idle_cap_bytes) return;  // freed as `b` goes
      idle_bytes_ += b->size();
      idle_[{device, b->size()}].push_back(std::move(b));
    } catch (...) {
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<std::unique_ptr<pinned_buffer>>> idle_;
  std::size_t idle_bytes_ = 0;
};

struct host_call {
  std::uint64_t token;
  std::function<void(std::uint64_t, std::error_code)> done;
};

void run_host_call(void* p) {
  std::unique_ptr<host_call> c(static_cast<host_call*>(p));
  try {
    c->done(c->token, {});
  } catch (...) {
    log_warning("batch copy completion: the callback threw");
  }
}

class cuda_group_copier final : public engine::group_copier {
 public:
  explicit cuda_group_copier(int device) : device_(device), stream_(device, CU_STREAM_NON_BLOCKING) {}

  ~cuda_group_copier() override {
    drain();
    std::lock_guard lock(mutex_);
    for (auto& [ptr, b] : chunks_) chunk_pool::instance().give(device_, std::move(b));
  }

  int device() const override { return device_; }

  std::byte* take_chunk(std::size_t nbytes) override {
    std::unique_ptr<pinned_buffer> b;
    try {
      b = chunk_pool::instance().take(device_, nbytes);
    } catch (const error&) {
      return nullptr;  // pinning refused (a limit): the driver works with the chunks it has
    }
    auto* p = static_cast<std::byte*>(b->data());
    std::lock_guard lock(mutex_);
    chunks_.emplace(p, std::move(b));
    return p;
  }

  void give_chunk(std::byte* chunk, std::size_t) noexcept override {
    std::unique_ptr<pinned_buffer> b;
    {
      std::lock_guard lock(mutex_);
      auto it = chunks_.find(chunk);
      if (it == chunks_.end()) return;
      b = std::move(it->second);
      chunks_.erase(it);
    }
    chunk_pool::instance().give(device_, std::move(b));
  }

  void add(bool to_device, std::byte* host, std::uintptr_t device_ptr, std::size_t nbytes) override {
    auto& q = to_device ? up_ : down_;
    const auto h = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(host));
    q.dst.push_back(to_device ? static_cast<CUdeviceptr>(device_ptr) : h);
    q.src.push_back(to_device ? h : static_cast<CUdeviceptr>(device_ptr));
    q.size.push_back(nbytes);
  }

  void flush(std::uint64_t token, std::function<void(std::uint64_t, std::error_code)> done) override {
    if (up_.size.empty() && down_.size.empty()) return;
    const cuda_api& a = cuda_or_throw();
    std::error_code ec;
    try {
      context_guard ctx(device_);
      issue(a, up_, true);
      issue(a, down_, false);
      if (a.cuLaunchHostFunc != nullptr) {
        auto call = std::make_unique<host_call>(host_call{token, std::move(done)});
        const CUresult r = a.cuLaunchHostFunc(stream_.get(), run_host_call, call.get());
        if (r == CUDA_SUCCESS) {
          call.release();
          return;
        }
        done = std::move(call->done);
        ec = cuda_code(r);
      } else {
        // A driver without host functions: wait here (the driver then runs one group at a time).
        const CUresult r = a.cuStreamSynchronize(stream_.get());
        if (r != CUDA_SUCCESS) ec = cuda_code(r);
      }
    } catch (const std::system_error& e) {
      ec = e.code();
      up_.clear();
      down_.clear();
    }
    done(token, ec);
  }

  void drain() noexcept override {
    if (!stream_) return;
    release_in_context(device_, "cuStreamSynchronize", [s = stream_.get()] { return cuda()->cuStreamSynchronize(s); });
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

  int device_;
  cuda_stream stream_;
  queue up_, down_;
  std::mutex mutex_;
  std::map<std::byte*, std::unique_ptr<pinned_buffer>> chunks_;
};

}  // namespace

std::unique_ptr<engine::group_copier> make_cuda_group_copier(int device) {
  return std::make_unique<cuda_group_copier>(device);
}

}  // namespace gdskit::gpu
