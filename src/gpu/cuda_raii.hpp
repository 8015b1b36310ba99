// Owners of CUDA driver resources: the calling thread's current context, streams and events. Move-only where
// they own something; a moved-from object equals a default-constructed one; destructors never throw (a
// failure is logged).
#pragma once

#include <exception>
#include <utility>

#include <fmt/format.h>

#include "common/log.hpp"
#include "gdskit/error.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {

/// Makes the primary context of `device` current on the calling thread for the guard's lifetime
/// (cuCtxPushCurrent) and restores the caller's context when it ends (cuCtxPopCurrent). Throws gdskit::error:
/// ENODEV when no driver is usable or the device does not exist, cuda category when the push fails. Neither
/// copyable nor movable: it belongs to one thread and one scope.
class context_guard {
 public:
  explicit context_guard(int device);
  ~context_guard();
  context_guard(const context_guard&) = delete;
  context_guard& operator=(const context_guard&) = delete;

 private:
  const shim::cuda_api* api_ = nullptr;
};

/// For destructors: runs `release` (a driver call returning CUresult) with `device`'s context current, and
/// logs what fails (no driver, no context, the call itself) instead of throwing.
template <class Release>
void release_in_context(int device, const char* what, Release release) noexcept;

/// A driver object of `device` created with flags (Traits::create) and destroyed with the owner
/// (Traits::destroy, in the device's context).
template <class Traits>
class driver_handle {
 public:
  using handle_type = typename Traits::handle_type;

  driver_handle() noexcept = default;
  /// Throws gdskit::error (ENODEV or cuda category).
  driver_handle(int device, unsigned flags) : device_(device) {
    context_guard ctx(device);
    shim::check_cuda(Traits::create(shim::cuda_or_throw(), &h_, flags), Traits::create_name);
  }
  ~driver_handle() { reset(); }
  driver_handle(driver_handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)), device_(std::exchange(o.device_, -1)) {}
  driver_handle& operator=(driver_handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
      device_ = std::exchange(o.device_, -1);
    }
    return *this;
  }
  driver_handle(const driver_handle&) = delete;
  driver_handle& operator=(const driver_handle&) = delete;

  handle_type get() const noexcept { return h_; }
  int device() const noexcept { return device_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  void reset() noexcept {
    if (h_ == nullptr) return;
    handle_type h = std::exchange(h_, nullptr);
    release_in_context(std::exchange(device_, -1), Traits::destroy_name,
                       [h] { return Traits::destroy(*shim::cuda(), h); });
  }

 private:
  handle_type h_ = nullptr;
  int device_ = -1;
};

struct stream_traits {
  using handle_type = shim::CUstream;
  static constexpr const char* create_name = "cuStreamCreate";
  static constexpr const char* destroy_name = "cuStreamDestroy";
  static shim::CUresult create(const shim::cuda_api& a, handle_type* h, unsigned flags) { return a.cuStreamCreate(h, flags); }
  static shim::CUresult destroy(const shim::cuda_api& a, handle_type h) { return a.cuStreamDestroy(h); }
};

struct event_traits {
  using handle_type = shim::CUevent;
  static constexpr const char* create_name = "cuEventCreate";
  static constexpr const char* destroy_name = "cuEventDestroy";
  static shim::CUresult create(const shim::cuda_api& a, handle_type* h, unsigned flags) { return a.cuEventCreate(h, flags); }
  static shim::CUresult destroy(const shim::cuda_api& a, handle_type h) { return a.cuEventDestroy(h); }
};

/// A CUDA stream (cuStreamCreate flags), move-only.
using cuda_stream = driver_handle<stream_traits>;
/// A CUDA event (cuEventCreate flags), move-only.
using cuda_event = driver_handle<event_traits>;

template <class Release>
void release_in_context(int device, const char* what, Release release) noexcept {
  try {
    context_guard ctx(device);
    const shim::CUresult r = release();
    if (r != shim::CUDA_SUCCESS) log_warning(fmt::format("{}: {}", what, shim::cuda_error_name(r)));
  } catch (const std::exception& e) {
    log_warning(fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    log_warning(fmt::format("{}: unknown failure", what));
  }
}

}  // namespace gdskit::gpu
