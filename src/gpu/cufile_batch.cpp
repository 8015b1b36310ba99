#include "gpu/cufile_batch.hpp"

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "common/timespec.hpp"
#include "gdskit/error.hpp"

namespace gdskit::gpu {
namespace {

using namespace shim;

// What one entry's event says: bytes and error.
std::pair<std::size_t, std::error_code> outcome(const CUfileIOEvents_t& ev) {
  const auto ret = static_cast<long long>(static_cast<ssize_t>(ev.ret));
  switch (ev.status) {
    case CUFILE_COMPLETE:
      if (ret < 0) return {0, decode_cufile_ssize(ret, EIO)};
      return {static_cast<std::size_t>(ret), {}};
    case CUFILE_CANCELED:
      return {0, errno_code(ECANCELED)};
    case CUFILE_TIMEOUT:
      return {0, errno_code(ETIMEDOUT)};
    default:  // FAILED, INVALID, or a status this build does not know: never taken for success
      return {0, ret < 0 ? decode_cufile_ssize(ret, EIO) : errno_code(EIO)};
  }
}

struct slot {
  CUfileBatchHandle_t handle = nullptr;
  std::vector<CUfileIOParams_t> params;
  std::vector<std::uint8_t> ended;  // per entry of params: reported already
  std::size_t first = 0;            // index of params[0] among all entries
  std::size_t outstanding = 0;
};

}  // namespace

void run_cufile_batch(const cufile_api& api, std::span<const cufile_batch_entry> entries, const std::function<bool()>& stop,
                      const std::function<void(std::size_t, std::size_t, std::error_code)>& done,
                      const cufile_batch_options& options) {
  if (entries.empty()) return;
  if (!api.has_batch()) throw error(errno_code(ENOTSUP), "cuFile batch: the library has no batch API");
  const unsigned per_batch = std::clamp(options.entries_per_batch, 1u, k_cufile_batch_max);
  std::vector<slot> slots(std::max(1u, options.batches_in_flight));
  std::vector<CUfileIOEvents_t> events(per_batch);
  const timespec wait = to_timespec(options.poll_timeout);
  std::size_t next = 0;
  bool stopping = false;
  bool cancelled = false;
  unsigned idle_polls_after_cancel = 0;
  // After a cancel, cuFile has this many poll timeouts to hand the entries back (a library that never does would
  // otherwise hold the caller forever; its entries are then reported as timed out).
  const unsigned k_cancel_polls = static_cast<unsigned>(30'000 / std::max<long long>(1, options.poll_timeout.count()));

  auto release = [&](slot& s) {
    if (s.handle != nullptr) api.cuFileBatchIODestroy(s.handle);
    s.handle = nullptr;
    s.outstanding = 0;
  };
  auto fill = [&](slot& s) {
    if (stopping || next >= entries.size() || s.outstanding != 0) return;
    const std::size_t n = std::min<std::size_t>(per_batch, entries.size() - next);
    // A fresh cuFile batch per submission: the handle is set up for exactly these entries and destroyed once
    // they have all ended.
    CUfileError_t st = api.cuFileBatchIOSetUp(&s.handle, static_cast<unsigned>(n));
    if (st.err != CU_FILE_SUCCESS) {
      s.handle = nullptr;
      for (std::size_t k = next; k < next + n; ++k) done(k, 0, cufile_status_code(st));
      next += n;
      return;
    }
    s.params.assign(n, CUfileIOParams_t{});
    s.ended.assign(n, 0);
    s.first = next;
    for (std::size_t j = 0; j < n; ++j) {
      const cufile_batch_entry& e = entries[next + j];
      CUfileIOParams_t& p = s.params[j];
      p.mode = CUFILE_BATCH;
      p.u.batch.devPtr_base = e.base;
      p.u.batch.file_offset = static_cast<off_t>(e.file_offset);
      p.u.batch.devPtr_offset = static_cast<off_t>(e.mem_offset);
      p.u.batch.size = e.nbytes;
      p.fh = e.fh;
      p.opcode = e.write ? CUFILE_WRITE : CUFILE_READ;
      p.cookie = reinterpret_cast<void*>(next + j);
    }
    st = api.cuFileBatchIOSubmit(s.handle, static_cast<unsigned>(n), s.params.data(), 0);
    if (st.err != CU_FILE_SUCCESS) {
      for (std::size_t k = next; k < next + n; ++k) done(k, 0, cufile_status_code(st));
      release(s);
    } else {
      s.outstanding = n;
    }
    next += n;
  };
  // Reports entry k of slot s once (a library that repeats an event, or an error after some events, cannot
  // report an entry twice).
  auto report = [&](slot& s, std::size_t k, std::size_t bytes, std::error_code ec) {
    if (k < s.first || k - s.first >= s.ended.size() || s.ended[k - s.first] != 0) return false;
    s.ended[k - s.first] = 1;
    done(k, bytes, ec);
    return true;
  };
  auto report_rest = [&](slot& s, std::error_code ec) {
    for (std::size_t j = 0; j < s.ended.size(); ++j) report(s, s.first + j, 0, ec);
  };
  auto reap = [&](slot& s, bool block) {
    if (s.outstanding == 0) return std::size_t{0};
    unsigned nr = static_cast<unsigned>(std::min<std::size_t>(s.outstanding, events.size()));
    timespec t = block ? wait : timespec{0, 0};
    const CUfileError_t st = api.cuFileBatchIOGetStatus(s.handle, block ? 1u : 0u, &nr, events.data(), &t);
    if (st.err != CU_FILE_SUCCESS) {
      // The batch cannot be asked about its entries any more: cancel it and report them with the error.
      api.cuFileBatchIOCancel(s.handle);
      report_rest(s, cufile_status_code(st));
      release(s);
      return std::size_t{1};
    }
    std::size_t ended = 0;
    for (unsigned j = 0; j < nr && j < events.size(); ++j) {
      const auto [bytes, ec] = outcome(events[j]);
      if (report(s, reinterpret_cast<std::size_t>(events[j].cookie), bytes, ec)) ++ended;
    }
    s.outstanding -= std::min(s.outstanding, ended);
    if (s.outstanding == 0) release(s);
    return static_cast<std::size_t>(nr);
  };

  for (auto& s : slots) fill(s);
  for (;;) {
    if (!stopping && stop()) stopping = true;
    if (stopping && !cancelled) {
      for (auto& s : slots) {
        if (s.outstanding > 0) api.cuFileBatchIOCancel(s.handle);
      }
      cancelled = true;
    }
    std::size_t busy = 0;
    for (const auto& s : slots) busy += s.outstanding > 0 ? 1 : 0;
    if (busy == 0 && (stopping || next >= entries.size())) break;
    // Wait on the slot submitted first; take whatever the others have without waiting.
    std::size_t got = 0;
    bool waited = false;
    for (auto& s : slots) {
      if (s.outstanding == 0) continue;
      got += reap(s, !waited);
      waited = true;
    }
    for (auto& s : slots) fill(s);
    if (cancelled && got == 0 && ++idle_polls_after_cancel > k_cancel_polls) {
      log_warning("cuFile batch: entries not handed back within 30 s of a cancel; reported as timed out");
      for (auto& s : slots) {
        if (s.outstanding == 0) continue;
        // The batch is not destroyed: its entries may still be running inside the library.
        report_rest(s, errno_code(ETIMEDOUT));
        s.outstanding = 0;
        s.handle = nullptr;
      }
      break;
    }
  }
}

}  // namespace gdskit::gpu
