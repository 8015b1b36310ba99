// Executes a request that has been split into tasks: on the thread pool or through io_uring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <system_error>

namespace gdskit::engine {

/// One contiguous piece of a request.
struct io_task {
  bool write = false;
  int fd = -1;
  bool direct = false;      ///< fd is O_DIRECT
  bool bounce = false;      ///< direct fd but range or memory not aligned: go through an aligned bounce buffer
  std::byte* buf = nullptr; ///< user memory for this piece
  std::size_t nbytes = 0;
  std::uint64_t offset = 0;
  std::size_t alignment = 4096;
  // results
  std::size_t done = 0;
  std::error_code ec;
};

/// Feedback between an engine and the adaptive scheduler: the depth to keep in flight now, and O_DIRECT bytes
/// as they complete. Both are called from the engine's threads.
struct io_observer {
  std::function<unsigned()> depth;
  std::function<void(std::size_t)> completed;
};

/// Runs one task to completion on the calling thread (EINTR retried, short transfers looped).
void run_task(io_task& task) noexcept;

/// Runs tasks on up to `parallelism` threads (the caller is one of them).
void run_threads(std::span<io_task> tasks, unsigned parallelism, const io_observer* obs = nullptr);

/// Runs tasks through a ring owned by the calling thread, keeping up to `depth` in flight (fewer while `obs`
/// asks for fewer). Bounce tasks run synchronously on the caller. Returns false (having run nothing) when
/// io_uring cannot be used.
bool run_uring(std::span<io_task> tasks, unsigned depth, const io_observer* obs = nullptr);

/// Empty when io_uring works in this process, else why not (probed once).
const std::string& uring_unavailable_reason();

}  // namespace gdskit::engine
