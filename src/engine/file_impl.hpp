// The inside of gdskit::file_handle, shared with the GPU paths (they reuse its descriptors and planner).
#pragma once

#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <optional>
#include <vector>

#include "engine/io_engine.hpp"
#include "engine/io_schedule.hpp"
#include "gdskit/file.hpp"
#include "engine/planner.hpp"
#include "posix/syscalls.hpp"
#include "shim/cufile.hpp"

namespace gdskit {

struct file_handle::impl {
  std::filesystem::path path;
  open_mode mode = open_mode::read;
  settings config;
  io_choice choice;
  posix::unique_fd fd;         // buffered
  posix::unique_fd direct_fd;  // O_DIRECT, or -1
  dev_t st_dev = 0;
  std::string fs_type;

  // State of the GPU paths, created on first use.
  struct gpu_state {
    std::mutex mutex;
    std::optional<engine::system_facts> facts;
    bool cufile_registered = false;
    shim::cufile_handle cufile;
  };
  mutable gpu_state gpu;

  // A read-only mapping of the file kept for page-cache residency checks (mincore). Kept for the handle's
  // life: mapping and unmapping per check would cost a TLB shootdown across every worker thread each time.
  struct residency_map {
    std::shared_mutex mutex;
    void* addr = nullptr;
    std::size_t nbytes = 0;
  };
  mutable residency_map rmap;

  // Asynchronous operations of the handle not yet finished (close() waits for them).
  mutable std::mutex async_mutex;
  mutable std::condition_variable async_idle;
  mutable unsigned async_inflight = 0;

  impl() = default;
  /// Closes what is still open; errors are logged (a destructor cannot report them).
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  /// Splits a request into tasks: aligned O_DIRECT chunks, bounce or buffered pieces at the edges.
  /// O_DIRECT chunks are `chunk_bytes` long.
  std::vector<engine::io_task> plan(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset,
                                    std::size_t chunk_bytes) const;
  /// Runs tasks inline (small requests) or on the chosen engine, O_DIRECT ones at the depth the scheduler of
  /// this transfer asks for (its measurement starts here).
  void execute(std::vector<engine::io_task>& tasks, std::size_t nbytes, engine::scheduled_transfer& sched) const;
  /// plan + execute, scheduled as one transfer; returns the bytes moved (short only at end of file).
  std::size_t transfer(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset) const;
  void throw_first_error(const std::vector<engine::io_task>& tasks, const char* op) const;
  std::uint64_t current_size() const;
  std::size_t read(void* buf, std::size_t nbytes, std::uint64_t offset) const;
  std::size_t write(const void* buf, std::size_t nbytes, std::uint64_t offset) const;
  /// Deregisters from cuFile, unmaps, closes both descriptors; returns the first close error.
  std::error_code close_all() noexcept;
};

/// The data paths' way into a handle (src/gpu): its inside, or EBADF when the handle is empty.
struct file_access {
  static const file_handle::impl& open_impl(const file_handle& f, const char* op) { return open_impl(f.impl_, op); }
  static const file_handle::impl& open_impl(const std::shared_ptr<file_handle::impl>& m, const char* op);
  static const std::shared_ptr<file_handle::impl>& shared(const file_handle& f) noexcept { return f.impl_; }
  /// A handle that shares `m` (the same open file).
  static file_handle wrap(std::shared_ptr<file_handle::impl> m) noexcept {
    file_handle h;
    h.impl_ = std::move(m);
    return h;
  }
};

}  // namespace gdskit
