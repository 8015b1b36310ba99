// An open file as the engine sees it: both descriptors, what O_DIRECT and the engine decided, the settings it
// was opened with, and the state the data paths keep per file (GPU facts, the cuFile handle, the residency
// mapping). file_handle (the public type) holds one; the transfer core and its routes work on it.
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
#include "engine/planner.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/path.hpp"
#include "posix/syscalls.hpp"
#include "shim/cufile.hpp"

namespace gdskit::engine {

struct open_file {
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
    std::optional<system_facts> facts;
    bool cufile_registered = false;
    shim::cufile_handle cufile;
    // The path of each kind of GPU memory (device, managed), decided once: a batch asks for every range.
    std::optional<data_path> route[2];
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

  open_file() = default;
  /// Opens `path` (see file_handle's constructor for the contract).
  open_file(const std::filesystem::path& path, open_mode mode, const open_options& options, const settings& config);
  /// Closes what is still open; errors are logged (a destructor cannot report them).
  ~open_file();
  open_file(const open_file&) = delete;
  open_file& operator=(const open_file&) = delete;

  /// Splits a request into tasks: aligned O_DIRECT chunks, bounce or buffered pieces at the edges.
  /// O_DIRECT chunks are `chunk_bytes` long.
  std::vector<io_task> plan(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset,
                            std::size_t chunk_bytes) const;
  /// Runs tasks inline (small requests) or on the chosen engine, O_DIRECT ones at the depth the scheduler of
  /// this transfer asks for (its measurement starts here).
  void execute(std::vector<io_task>& tasks, std::size_t nbytes, scheduled_transfer& sched) const;
  /// plan + execute, scheduled as one transfer; returns the bytes moved (short only at end of file).
  std::size_t transfer(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset) const;
  void throw_first_error(const std::vector<io_task>& tasks, const char* op) const;
  std::uint64_t current_size() const;
  /// Host-memory reads and writes of one range through the host engine (checked, clipped at end of file).
  std::size_t read(void* buf, std::size_t nbytes, std::uint64_t offset) const;
  std::size_t write(const void* buf, std::size_t nbytes, std::uint64_t offset) const;
  /// The path a transfer with memory `buf` takes, and why (file_handle::plan).
  path_decision decide_path(const buffer_view& buf) const;
  /// decide_path(buf).path without the reasons; for GPU memory decided once per kind and kept.
  data_path route(const buffer_view& buf) const;
  /// Deregisters from cuFile, unmaps, closes both descriptors; returns the first close error.
  std::error_code close_all() noexcept;
};

inline bool host_memory(const buffer_view& b) noexcept {
  return b.kind == memory_kind::host || b.kind == memory_kind::pinned;
}

}  // namespace gdskit::engine
