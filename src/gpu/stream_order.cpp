#include "gpu/stream_order.hpp"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "common/log.hpp"
#include "gdskit/error.hpp"
#include "gpu/cuda_raii.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {
namespace {

using namespace shim;

// Words of pinned, device-mapped memory that streams wait on. A word is reused once the event recorded after
// its wait has completed (the stream has gone past it); until then it stays taken.
class word_pool {
 public:
  static word_pool& instance() {
    static word_pool* p = new word_pool();  // never destroyed: streams may still wait during exit
    return *p;
  }

  struct word {
    volatile std::uint32_t* host = nullptr;
    CUdeviceptr device = 0;
    int index = -1;
  };

  word take(int dev) {
    const cuda_api& a = cuda_or_throw();
    std::lock_guard lock(mutex_);
    reclaim(a);
    if (free_.empty()) grow(a, dev);
    const int i = free_.back();
    free_.pop_back();
    words_[i].host[0] = 0;
    return words_[i];
  }

  // Called after the wait was enqueued: the word is free again once `stream` has passed this point.
  void retire(int index, CUstream stream, int dev) {
    const cuda_api& a = *cuda();
    CUevent e = nullptr;
    if (a.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS || a.cuEventRecord(e, stream) != CUDA_SUCCESS) {
      if (e != nullptr) a.cuEventDestroy(e);
      return;  // never reused: a word is 4 bytes
    }
    std::lock_guard lock(mutex_);
    retiring_.push_back({index, e, dev});
  }

 private:
  struct retiring {
    int index;
    CUevent event;
    int device;
  };
  void reclaim(const cuda_api& a) {
    for (std::size_t k = 0; k < retiring_.size();) {
      if (a.cuEventQuery(retiring_[k].event) == CUDA_SUCCESS) {
        a.cuEventDestroy(retiring_[k].event);
        free_.push_back(retiring_[k].index);
        retiring_[k] = retiring_.back();
        retiring_.pop_back();
      } else {
        ++k;
      }
    }
  }
  void grow(const cuda_api& a, int dev) {
    constexpr std::size_t k_page = 4096;
    void* p = nullptr;
    check_cuda(a.cuMemHostAlloc(&p, k_page, MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc (stream words)");
    CUdeviceptr d = reinterpret_cast<CUdeviceptr>(p);
    if (a.cuMemHostGetDevicePointer != nullptr) check_cuda(a.cuMemHostGetDevicePointer(&d, p, 0), "cuMemHostGetDevicePointer");
    (void)dev;
    auto* base = static_cast<volatile std::uint32_t*>(p);
    for (std::size_t k = 0; k < k_page / 64; ++k) {  // one word per cache line
      words_.push_back({base + k * 16, d + k * 64, static_cast<int>(words_.size())});
      free_.push_back(words_.back().index);
    }
  }

  std::mutex mutex_;
  std::vector<word> words_;
  std::vector<int> free_;
  std::vector<retiring> retiring_;
};

// The fallback gate: a host function on the stream that blocks until it is opened.
struct blocking_gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
};

void wait_gate(void* p) {
  auto* g = static_cast<std::shared_ptr<blocking_gate>*>(p);
  {
    std::unique_lock lock((*g)->mutex);
    (*g)->cv.wait(lock, [&] { return (*g)->open; });
  }
  delete g;
}

void run_function(void* p) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(p));
  try {
    (*fn)();
  } catch (const std::exception& e) {
    log_warning(std::string("stream-ordered batch: ") + e.what());
  }
}

}  // namespace

std::function<void()> stream_gate(void* stream, int device) {
  const cuda_api& a = cuda_or_throw();
  context_guard ctx(device);
  auto* s = static_cast<CUstream>(stream);
  if (a.cuStreamWaitValue32 != nullptr) {
    word_pool::word w = word_pool::instance().take(device);
    if (a.cuStreamWaitValue32(s, w.device, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS) {
      word_pool::instance().retire(w.index, s, device);
      volatile std::uint32_t* flag = w.host;
      return [flag] {
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *flag = 1;
      };
    }
    // Not supported here: the word is simply never used again.
  }
  if (a.cuLaunchHostFunc == nullptr) {
    throw error(errno_code(ENOTSUP), "stream-ordered batch: the driver can neither wait on memory nor run host functions");
  }
  auto gate = std::make_shared<blocking_gate>();
  auto* arg = new std::shared_ptr<blocking_gate>(gate);
  const CUresult r = a.cuLaunchHostFunc(s, wait_gate, arg);
  if (r != CUDA_SUCCESS) {
    delete arg;
    check_cuda(r, "cuLaunchHostFunc (stream-ordered batch)");
  }
  return [gate] {
    {
      std::lock_guard lock(gate->mutex);
      gate->open = true;
    }
    gate->cv.notify_all();
  };
}

void when_stream_reaches(void* stream, int device, std::function<void()> fn) {
  const cuda_api& a = cuda_or_throw();
  if (a.cuLaunchHostFunc == nullptr) {
    throw error(errno_code(ENOTSUP), "stream-ordered batch: the driver cannot run host functions");
  }
  context_guard ctx(device);
  auto* arg = new std::function<void()>(std::move(fn));
  const CUresult r = a.cuLaunchHostFunc(static_cast<CUstream>(stream), run_function, arg);
  if (r != CUDA_SUCCESS) {
    delete arg;
    check_cuda(r, "cuLaunchHostFunc (stream-ordered batch)");
  }
}

}  // namespace gdskit::gpu
