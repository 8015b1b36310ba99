#include "gdskit/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>

#include "common/log.hpp"
#include "common/printable.hpp"

namespace gdskit {
namespace {

// Names and our own one-line explanations of the cuFile status codes (values from the cuFile ABI).
const char* cufile_status_text(int status) noexcept {
  switch (status) {
    case 0: return "success";
    case 5001: return "nvidia-fs driver not loaded (and compat mode not allowed)";
    case 5002: return "invalid driver properties";
    case 5003: return "driver limit not supported";
    case 5004: return "nvidia-fs driver version mismatch";
    case 5005: return "cannot read nvidia-fs driver version";
    case 5006: return "driver is closing";
    case 5007: return "GPUDirect Storage not supported on this platform";
    case 5008: return "GPUDirect Storage not supported on this file";
    case 5009: return "GPUDirect Storage not supported on this GPU";
    case 5010: return "nvidia-fs driver error";
    case 5011: return "CUDA driver error";
    case 5012: return "invalid CUDA pointer";
    case 5013: return "invalid CUDA memory type (managed or host memory where device memory is required)";
    case 5014: return "CUDA pointer range error";
    case 5015: return "CUDA context mismatch";
    case 5016: return "invalid mapping size";
    case 5017: return "invalid mapping range";
    case 5018: return "invalid file type";
    case 5019: return "invalid file open flags";
    case 5020: return "O_DIRECT not set";
    case 5022: return "invalid value";
    case 5023: return "memory already registered";
    case 5024: return "memory not registered";
    case 5025: return "permission denied";
    case 5026: return "driver already open";
    case 5027: return "file handle not registered";
    case 5028: return "file handle already registered";
    case 5029: return "device not found";
    case 5030: return "cuFile internal error";
    case 5031: return "failed to get a new file descriptor";
    case 5033: return "nvidia-fs setup error";
    case 5034: return "GPUDirect Storage disabled by configuration for this file";
    case 5035: return "batch submit failed";
    case 5036: return "GPU memory pinning failed";
    case 5037: return "batch queue full";
    case 5038: return "asynchronous I/O not supported";
    case 5039: return "batch setup internal error";
    case 5040: return "batch submit internal error";
    case 5041: return "batch status internal error";
    case 5042: return "batch cancel internal error";
    case 5043: return "cuFile out of memory";
    case 5044: return "cuFile I/O error";
    case 5045: return "buffer registration internal error";
    case 5046: return "hash operation error";
    case 5047: return "invalid CUDA context";
    case 5048: return "nvidia-fs internal driver error";
    case 5049: return "compat mode is off and the direct path is unavailable";
    default: return nullptr;
  }
}

class cufile_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cufile"; }
  std::string message(int status) const override {
    const char* text = cufile_status_text(status);
    return text != nullptr ? fmt::format("cuFile error {}: {}", status, text)
                           : fmt::format("cuFile error {}", status);
  }
};

// A few CUresult names we meet in practice; the driver's cuGetErrorName is used where it is loaded.
class cuda_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int result) const override {
    const char* text = nullptr;
    switch (result) {
      case 1: text = "CUDA_ERROR_INVALID_VALUE"; break;
      case 2: text = "CUDA_ERROR_OUT_OF_MEMORY"; break;
      case 3: text = "CUDA_ERROR_NOT_INITIALIZED"; break;
      case 4: text = "CUDA_ERROR_DEINITIALIZED"; break;
      case 34: text = "CUDA_ERROR_STUB_LIBRARY"; break;
      case 100: text = "CUDA_ERROR_NO_DEVICE"; break;
      case 101: text = "CUDA_ERROR_INVALID_DEVICE"; break;
      case 201: text = "CUDA_ERROR_INVALID_CONTEXT"; break;
      case 400: text = "CUDA_ERROR_INVALID_HANDLE"; break;
      case 700: text = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
      case 712: text = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; break;
      case 999: text = "CUDA_ERROR_UNKNOWN"; break;
      default: break;
    }
    return text != nullptr ? fmt::format("CUDA error {} ({})", result, text) : fmt::format("CUDA error {}", result);
  }
};

std::string format_what(std::string_view operation, std::string_view path, std::int64_t offset_bytes,
                        std::size_t nbytes, std::string_view detail) {
  std::string out(operation);
  // Paths often come from outside (an index, a folder listing): the message shows them escaped, so that a
  // control character in one cannot drive the terminal that prints it; path() keeps the bytes.
  if (!path.empty()) out += fmt::format(" \"{}\"", printable(path));
  if (offset_bytes >= 0) out += fmt::format(" at {}+{}", offset_bytes, nbytes);
  if (!detail.empty()) out += fmt::format(" ({})", detail);
  return out;
}

}  // namespace

const std::error_category& cufile_category() noexcept {
  static const cufile_category_impl instance;
  return instance;
}

const std::error_category& cuda_category() noexcept {
  static const cuda_category_impl instance;
  return instance;
}

error::error(std::error_code code, std::string_view operation, std::string_view path, std::int64_t offset_bytes,
             std::size_t nbytes, std::string_view detail)
    : std::system_error(code, format_what(operation, path, offset_bytes, nbytes, detail)),
      operation_(operation),
      path_(path),
      detail_(detail),
      offset_bytes_(offset_bytes),
      nbytes_(nbytes) {}

error::error(std::error_code code, std::string_view what) : std::system_error(code, std::string(what)), operation_(what) {}

std::error_code decode_cufile_ssize(long long result, int errno_now) noexcept {
  if (result >= 0) return {};
  if (result == -1) return errno_code(errno_now != 0 ? errno_now : EIO);
  if (-result > 5000) return cufile_code(static_cast<int>(-result));
  return errno_code(static_cast<int>(-result));
}

short_read_error::short_read_error(std::string_view path, std::int64_t offset_bytes, std::size_t nbytes,
                                   std::size_t transferred)
    : error(errno_code(EIO), "read_exact", path, offset_bytes, nbytes,
            fmt::format("file ended after {} of {} bytes", transferred, nbytes)),
      transferred_(transferred) {}

void log_warning(std::string_view message) noexcept {
  // One fprintf per line, so concurrent warnings do not interleave within a line.
  std::fprintf(stderr, "gdskit: warning: %.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace gdskit
