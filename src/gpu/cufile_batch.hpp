// cuFile's batch API as a route for many small ranges in true GDS: entries go out in cuFile batches of at most
// 128 (the library's default io_batchsize), several batches in flight, each entry's own status checked, and
// completions collected with a timeout (never a wait for the whole batch without one), so a deadline or cancel
// is seen within one timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <system_error>

#include "shim/cufile.hpp"

namespace gdskit::gpu {

/// One entry: `nbytes` between `base` + `mem_offset` (device memory registered or not) and `file_offset` of the
/// registered file `fh`.
struct cufile_batch_entry {
  shim::CUfileHandle_t fh = nullptr;
  bool write = false;
  void* base = nullptr;
  std::size_t mem_offset = 0;
  std::uint64_t file_offset = 0;
  std::size_t nbytes = 0;
};

struct cufile_batch_options {
  /// Entries per cuFile batch (at most k_cufile_batch_max and the library's limit).
  unsigned entries_per_batch = shim::k_cufile_batch_max;
  /// cuFile batches in flight at once.
  unsigned batches_in_flight = 2;
  /// Longest wait for completions before `stop` is asked again.
  std::chrono::milliseconds poll_timeout{10};
};

/// Runs every entry through `api`'s batch API. `done(k, bytes, ec)` is called once per entry k that ran (bytes:
/// what cuFile reported; ec: the entry's own error, or the batch call's). Once `stop()` returns true, entries not
/// yet submitted are skipped and the batches in flight are cancelled (cuFileBatchIOCancel) and waited for before
/// it returns. Throws gdskit::error (cufile category) only when no batch can be set up at all.
void run_cufile_batch(const shim::cufile_api& api, std::span<const cufile_batch_entry> entries,
                      const std::function<bool()>& stop,
                      const std::function<void(std::size_t k, std::size_t bytes, std::error_code ec)>& done,
                      const cufile_batch_options& options = {});

}  // namespace gdskit::gpu
