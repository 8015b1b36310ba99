#include "gpu/cuda_raii.hpp"

#include "gdskit/error.hpp"

namespace gdskit::gpu {

using namespace shim;

context_guard::context_guard(int device) {
  const cuda_api& a = cuda_or_throw();
  const CUcontext ctx = primary_context(device);
  check_cuda(a.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  api_ = &a;
}

context_guard::~context_guard() {
  CUcontext popped = nullptr;
  const CUresult r = api_->cuCtxPopCurrent(&popped);
  if (r != CUDA_SUCCESS) log_warning(fmt::format("cuCtxPopCurrent: {}", cuda_error_name(r)));
}

}  // namespace gdskit::gpu
