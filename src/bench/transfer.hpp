// One worker's way of moving bytes between the file and its buffer, per transfer type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"

namespace gdskit::bench {

/// A worker's buffer of `capacity` bytes (host or GPU) and the transfers into and out of it.
class transfer {
 public:
  virtual ~transfer() = default;
  /// File -> buffer; returns the bytes read (fewer only at end of file).
  virtual std::size_t read(const file_handle& f, std::uint64_t offset, std::size_t n) = 0;
  /// Buffer -> file.
  virtual std::size_t write(const file_handle& f, std::uint64_t offset, std::size_t n) = 0;
  /// Host bytes into the buffer at byte `at` (before writes) and back out (for verification).
  virtual void load(const std::byte* src, std::size_t n, std::size_t at = 0) = 0;
  virtual void store(std::byte* dst, std::size_t n, std::size_t at = 0) = 0;
  /// The whole buffer, for the batch types' ranges.
  virtual buffer_view memory() const = 0;
  /// The CUDA stream batches are ordered on (gdsio 7), or nullptr.
  virtual void* stream() const { return nullptr; }
  /// Waits until the stream has reached everything queued on it so far.
  virtual void sync_stream() {}
};

/// The path a transfer type takes for this file, and why.
struct path_report {
  std::string path;
  std::vector<std::string> reasons;
  bool direct_possible = false;  ///< the planner found a direct DMA route (see path_decision)
};

/// Whether the GPU transfer types can run here; `reason` says why not.
bool gpu_usable(std::string* reason);
/// Number of GPUs (0 when none is usable).
int gpu_devices();

/// A transfer for `xfer` with a buffer of `capacity` bytes on GPU `gpu` (ignored for host), and a CUDA stream of
/// its own when `stream`. Throws gdskit::error when the buffer or the stream cannot be had.
std::unique_ptr<transfer> make_transfer(xfer_kind xfer, std::size_t capacity, int gpu, bool stream = false);
/// What path `xfer` takes for `f` (planner's decision for GPU buffers; O_DIRECT and engine for host).
path_report describe_path(xfer_kind xfer, const file_handle& f, int gpu);

/// Implemented by gpu_transfer.cpp when the GPU API is built.
std::unique_ptr<transfer> make_gpu_transfer(xfer_kind xfer, std::size_t capacity, int gpu, bool stream);
path_report describe_gpu_path(xfer_kind xfer, const file_handle& f, int gpu);

}  // namespace gdskit::bench
