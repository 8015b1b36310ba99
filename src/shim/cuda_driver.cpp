#include "shim/cuda_driver.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "gdskit/error.hpp"

namespace gdskit::shim {
namespace {

struct loaded {
  cuda_api api{};
  bool ok = false;
  std::string reason;
};

template <class F>
bool bind(void* lib, F& slot, std::initializer_list<const char*> names, std::string& missing) {
  for (const char* n : names) {
    if (void* p = ::dlsym(lib, n)) {
      slot = reinterpret_cast<F>(p);
      return true;
    }
  }
  missing = *names.begin();
  return false;
}

loaded load() {
  loaded out;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    out.reason = dlopen_failure("libcuda.so.1", " (no NVIDIA driver)");
    return out;
  }
  cuda_api& a = out.api;
  std::string missing;
  // _v2 entry points are the ones cuda.h maps the plain names to.
  bool ok = bind(lib, a.cuInit, {"cuInit"}, missing) && bind(lib, a.cuDriverGetVersion, {"cuDriverGetVersion"}, missing) &&
            bind(lib, a.cuDeviceGetCount, {"cuDeviceGetCount"}, missing) && bind(lib, a.cuDeviceGet, {"cuDeviceGet"}, missing) &&
            bind(lib, a.cuDeviceGetName, {"cuDeviceGetName"}, missing) &&
            bind(lib, a.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}, missing) &&
            bind(lib, a.cuDeviceTotalMem, {"cuDeviceTotalMem_v2"}, missing) &&
            bind(lib, a.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, missing) &&
            bind(lib, a.cuDevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, missing) &&
            bind(lib, a.cuCtxSetCurrent, {"cuCtxSetCurrent"}, missing) && bind(lib, a.cuCtxGetCurrent, {"cuCtxGetCurrent"}, missing) &&
            bind(lib, a.cuCtxGetDevice, {"cuCtxGetDevice"}, missing) && bind(lib, a.cuMemAlloc, {"cuMemAlloc_v2"}, missing) &&
            bind(lib, a.cuMemFree, {"cuMemFree_v2"}, missing) && bind(lib, a.cuMemHostAlloc, {"cuMemHostAlloc"}, missing) &&
            bind(lib, a.cuMemFreeHost, {"cuMemFreeHost"}, missing) &&
            bind(lib, a.cuMemHostRegister, {"cuMemHostRegister_v2", "cuMemHostRegister"}, missing) &&
            bind(lib, a.cuMemHostUnregister, {"cuMemHostUnregister"}, missing) &&
            bind(lib, a.cuMemcpyHtoD, {"cuMemcpyHtoD_v2"}, missing) && bind(lib, a.cuMemcpyDtoH, {"cuMemcpyDtoH_v2"}, missing) &&
            bind(lib, a.cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, missing) &&
            bind(lib, a.cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, missing) &&
            bind(lib, a.cuMemsetD8, {"cuMemsetD8_v2"}, missing) && bind(lib, a.cuStreamCreate, {"cuStreamCreate"}, missing) &&
            bind(lib, a.cuStreamDestroy, {"cuStreamDestroy_v2"}, missing) &&
            bind(lib, a.cuStreamSynchronize, {"cuStreamSynchronize"}, missing) &&
            bind(lib, a.cuEventCreate, {"cuEventCreate"}, missing) && bind(lib, a.cuEventDestroy, {"cuEventDestroy_v2"}, missing) &&
            bind(lib, a.cuEventRecord, {"cuEventRecord"}, missing) && bind(lib, a.cuEventSynchronize, {"cuEventSynchronize"}, missing) &&
            bind(lib, a.cuEventQuery, {"cuEventQuery"}, missing) && bind(lib, a.cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}, missing) &&
            bind(lib, a.cuPointerGetAttribute, {"cuPointerGetAttribute"}, missing) &&
            bind(lib, a.cuGetErrorName, {"cuGetErrorName"}, missing) &&
            bind(lib, a.cuDeviceGetPCIBusId, {"cuDeviceGetPCIBusId"}, missing) &&
            bind(lib, a.cuCtxPushCurrent, {"cuCtxPushCurrent_v2", "cuCtxPushCurrent"}, missing) &&
            bind(lib, a.cuCtxPopCurrent, {"cuCtxPopCurrent_v2", "cuCtxPopCurrent"}, missing);
  if (!ok) {
    out.reason = fmt::format("libcuda.so.1 lacks {} (driver too old or a stub library)", missing);
    return out;
  }
  // Newer entry points, used where present. cuMemcpyBatchAsync_v2 is CUDA 13's signature (12.8's unsuffixed
  // one takes a failure index too, so it is never bound under this type).
  std::string optional_missing;
  bind(lib, a.cuMemcpyBatchAsync, {"cuMemcpyBatchAsync_v2"}, optional_missing);
  bind(lib, a.cuLaunchHostFunc, {"cuLaunchHostFunc"}, optional_missing);
  bind(lib, a.cuStreamWaitValue32, {"cuStreamWaitValue32_v2"}, optional_missing);
  bind(lib, a.cuStreamWriteValue64, {"cuStreamWriteValue64_v2"}, optional_missing);
  bind(lib, a.cuStreamWaitEvent, {"cuStreamWaitEvent"}, optional_missing);
  bind(lib, a.cuMemHostGetDevicePointer, {"cuMemHostGetDevicePointer_v2"}, optional_missing);
  bind(lib, a.cuStreamQuery, {"cuStreamQuery"}, optional_missing);
  if (!(bind(lib, a.cuModuleLoadData, {"cuModuleLoadData"}, optional_missing) &&
        bind(lib, a.cuModuleGetFunction, {"cuModuleGetFunction"}, optional_missing) &&
        bind(lib, a.cuLaunchKernel, {"cuLaunchKernel"}, optional_missing))) {
    a.cuModuleLoadData = nullptr;
    a.cuModuleGetFunction = nullptr;
    a.cuLaunchKernel = nullptr;
  }
  CUresult r = a.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    a.cuGetErrorName(r, &name);
    out.reason = fmt::format("cuInit failed: {} ({})", name != nullptr ? name : "unknown", r);
    return out;
  }
  int count = 0;
  if (a.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    out.reason = "the driver reports no CUDA device";
    return out;
  }
  out.ok = true;
  return out;
}

const loaded& state() {
  static const loaded s = load();
  return s;
}

}  // namespace

std::string dlopen_failure(const char* library, const char* when_missing) {
  const char* e = ::dlerror();
  const std::string_view text = e != nullptr ? e : "";
  // glibc: "<name>: cannot open shared object file: No such file or directory" when the search found nothing.
  // A library that was found but needs one that is missing names that one first: that is not "not found".
  if (text.empty() || (text.starts_with(std::string(library) + ":") &&
                       text.find("cannot open shared object file") != std::string_view::npos &&
                       text.ends_with("No such file or directory"))) {
    return fmt::format("{} not found{}", library, when_missing);
  }
  return fmt::format("{} could not be loaded: {}", library, text);
}

const cuda_api* cuda(std::string* reason) {
  const loaded& s = state();
  if (!s.ok) {
    if (reason != nullptr) *reason = s.reason;
    return nullptr;
  }
  return &s.api;
}

const cuda_api& cuda_or_throw() {
  std::string reason;
  const cuda_api* a = cuda(&reason);
  if (a == nullptr) throw error(errno_code(ENODEV), "no usable GPU: " + reason);
  return *a;
}

std::string cuda_error_name(CUresult r) {
  if (const cuda_api* a = cuda()) {
    const char* name = nullptr;
    if (a->cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr) return name;
  }
  return fmt::format("CUresult {}", r);
}

void check_cuda(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw error(cuda_code(r), fmt::format("{}: {}", what, cuda_error_name(r)));
}

CUcontext primary_context(int device) {
  const cuda_api* a = &cuda_or_throw();
  static std::mutex mutex;
  static std::vector<CUcontext> contexts;
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(mutex);
    int count = 0;
    a->cuDeviceGetCount(&count);
    if (device < 0 || device >= count) {
      throw error(errno_code(ENODEV), fmt::format("GPU {} does not exist ({} visible)", device, count));
    }
    if (contexts.size() < static_cast<std::size_t>(count)) contexts.resize(static_cast<std::size_t>(count), nullptr);
    if (contexts[static_cast<std::size_t>(device)] == nullptr) {
      CUdevice dev = 0;
      check_cuda(a->cuDeviceGet(&dev, device), "cuDeviceGet");
      check_cuda(a->cuDevicePrimaryCtxRetain(&contexts[static_cast<std::size_t>(device)], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = contexts[static_cast<std::size_t>(device)];
  }
  return ctx;
}

void use_device(int device) {
  const cuda_api* a = &cuda_or_throw();
  const CUcontext ctx = primary_context(device);
  CUcontext cur = nullptr;
  a->cuCtxGetCurrent(&cur);
  if (cur != ctx) check_cuda(a->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

}  // namespace gdskit::shim
