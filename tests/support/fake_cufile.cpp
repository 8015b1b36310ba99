// A stand-in for libcufile.so.0 that tests load by path: the core entry points over plain pread/pwrite and the
// batch API with entries that complete after a delay, fail at a chosen file offset, or never complete until
// cancelled. It enforces what the real library limits (at most 128 entries per batch) and records how it was
// called, so tests can prove a caller never waited for a whole batch without a timeout.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "shim/cufile.hpp"

using namespace gdskit::shim;

namespace {

using clock_type = std::chrono::steady_clock;

struct entry {
  CUfileIOParams_t p;
  clock_type::time_point ready;
  int status = CUFILE_WAITING;
  std::size_t ret = 0;
  bool returned = false;
};

struct batch {
  unsigned capacity = 0;
  std::vector<entry> entries;
};

struct state {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<void*, int> handles;  // handle -> fd
  std::map<void*, batch> batches;
  int next_handle = 1;
  int next_batch = 1;
  // controls
  long long fail_offset = -1;
  int delay_ms = 0;
  bool hang = false;
  // observations
  unsigned max_setup = 0;
  unsigned untimed_full_waits = 0;
  unsigned setups = 0;
  unsigned cancels = 0;
  bool force_compat = false;  // CUFILE_PARAM_FORCE_COMPAT_MODE as last set
  int opens = 0;
  bool opened_compat = false;  // force_compat when the driver last opened
};

state& st() {
  static state s;
  return s;
}

CUfileError_t ok() { return {CU_FILE_SUCCESS, 0}; }
CUfileError_t fail(int code) { return {code, 0}; }

// Runs an entry's I/O now (under the lock: the test's files are small).
void perform(entry& e, int fd) {
  const auto& b = e.p.u.batch;
  if (static_cast<long long>(b.file_offset) == st().fail_offset) {
    e.status = CUFILE_FAILED;
    e.ret = static_cast<std::size_t>(-static_cast<ssize_t>(EIO));
    return;
  }
  auto* mem = static_cast<char*>(b.devPtr_base) + b.devPtr_offset;
  const ssize_t n = e.p.opcode == CUFILE_WRITE ? ::pwrite(fd, mem, b.size, b.file_offset) : ::pread(fd, mem, b.size, b.file_offset);
  if (n < 0) {
    e.status = CUFILE_FAILED;
    e.ret = static_cast<std::size_t>(-static_cast<ssize_t>(errno));
  } else {
    e.status = CUFILE_COMPLETE;
    e.ret = static_cast<std::size_t>(n);
  }
}

}  // namespace

extern "C" {

// ---- test controls and observations ----
void fake_cufile_set(long long fail_offset, int delay_ms, bool hang) {
  std::lock_guard lock(st().mutex);
  st().fail_offset = fail_offset;
  st().delay_ms = delay_ms;
  st().hang = hang;
}
void fake_cufile_observed(unsigned* max_setup, unsigned* untimed_full_waits, unsigned* setups, unsigned* cancels) {
  std::lock_guard lock(st().mutex);
  *max_setup = st().max_setup;
  *untimed_full_waits = st().untimed_full_waits;
  *setups = st().setups;
  *cancels = st().cancels;
}
unsigned fake_cufile_live_batches() {
  std::lock_guard lock(st().mutex);
  return static_cast<unsigned>(st().batches.size());
}

// Driver opens so far, and whether the last one was in forced compat mode; resets both.
int fake_cufile_opens(bool* compat) {
  std::lock_guard lock(st().mutex);
  *compat = st().opened_compat;
  const int n = st().opens;
  st().opens = 0;
  st().force_compat = false;
  st().opened_compat = false;
  return n;
}

// ---- core ----
CUfileError_t cuFileSetParameterBool(int param, bool value) {
  std::lock_guard lock(st().mutex);
  if (param == 2) st().force_compat = value;  // CUFILE_PARAM_FORCE_COMPAT_MODE
  return ok();
}
CUfileError_t cuFileDriverOpen() {
  std::lock_guard lock(st().mutex);
  ++st().opens;
  st().opened_compat = st().force_compat;
  return ok();
}
CUfileError_t cuFileDriverClose_v2() { return ok(); }
CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t* p) {
  std::memset(p, 0, sizeof *p);
  p->max_batch_io_size = k_cufile_batch_max;
  return ok();
}
CUfileError_t cuFileHandleRegister(CUfileHandle_t* h, CUfileDescr_t* d) {
  std::lock_guard lock(st().mutex);
  void* key = reinterpret_cast<void*>(static_cast<std::uintptr_t>(st().next_handle++));
  st().handles[key] = d->handle.fd;
  *h = key;
  return ok();
}
void cuFileHandleDeregister(CUfileHandle_t h) {
  std::lock_guard lock(st().mutex);
  st().handles.erase(h);
}
CUfileError_t cuFileBufRegister(const void*, std::size_t, int) { return ok(); }
CUfileError_t cuFileBufDeregister(const void*) { return ok(); }
ssize_t cuFileRead(CUfileHandle_t h, void* buf, std::size_t n, off_t off, off_t buf_off) {
  int fd;
  {
    std::lock_guard lock(st().mutex);
    fd = st().handles.at(h);
  }
  return ::pread(fd, static_cast<char*>(buf) + buf_off, n, off);
}
ssize_t cuFileWrite(CUfileHandle_t h, const void* buf, std::size_t n, off_t off, off_t buf_off) {
  int fd;
  {
    std::lock_guard lock(st().mutex);
    fd = st().handles.at(h);
  }
  return ::pwrite(fd, static_cast<const char*>(buf) + buf_off, n, off);
}

// ---- batch ----
CUfileError_t cuFileBatchIOSetUp(CUfileBatchHandle_t* b, unsigned nr) {
  std::lock_guard lock(st().mutex);
  st().max_setup = std::max(st().max_setup, nr);
  ++st().setups;
  if (nr == 0 || nr > k_cufile_batch_max) return fail(5001 + 22);  // an invalid-value style error
  void* key = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x10000 + st().next_batch++));
  st().batches[key].capacity = nr;
  *b = key;
  return ok();
}
CUfileError_t cuFileBatchIOSubmit(CUfileBatchHandle_t b, unsigned nr, CUfileIOParams_t* p, unsigned) {
  std::lock_guard lock(st().mutex);
  auto it = st().batches.find(b);
  if (it == st().batches.end()) return fail(5001 + 22);
  if (it->second.entries.size() + nr > it->second.capacity) return fail(5038);
  const auto ready = st().hang ? clock_type::time_point::max() : clock_type::now() + std::chrono::milliseconds(st().delay_ms);
  for (unsigned i = 0; i < nr; ++i) it->second.entries.push_back({p[i], ready});
  st().cv.notify_all();
  return ok();
}
CUfileError_t cuFileBatchIOGetStatus(CUfileBatchHandle_t b, unsigned min_nr, unsigned* nr, CUfileIOEvents_t* ev,
                                     struct timespec* timeout) {
  std::unique_lock lock(st().mutex);
  auto it = st().batches.find(b);
  if (it == st().batches.end()) return fail(5001 + 22);
  batch& bt = it->second;
  std::size_t pending = 0;
  for (const auto& e : bt.entries) pending += e.returned ? 0 : 1;
  if (timeout == nullptr && min_nr >= pending) ++st().untimed_full_waits;
  const auto deadline = timeout == nullptr ? clock_type::time_point::max()
                                           : clock_type::now() + std::chrono::seconds(timeout->tv_sec) +
                                                 std::chrono::nanoseconds(timeout->tv_nsec);
  const unsigned cap = *nr;
  // Entries that are due run now; finished ones not yet returned go out, up to the caller's capacity.
  auto collect = [&](unsigned have) {
    const auto now = clock_type::now();
    for (auto& e : bt.entries) {
      if (have >= cap) break;
      if (e.returned) continue;
      if (e.status == CUFILE_WAITING && e.ready <= now) perform(e, st().handles.at(e.p.fh));
      if (e.status == CUFILE_WAITING) continue;
      ev[have++] = {e.p.cookie, e.status, e.ret};
      e.returned = true;
    }
    return have;
  };
  unsigned got = collect(0);
  while (got < min_nr && clock_type::now() < deadline) {
    st().cv.wait_until(lock, std::min(deadline, clock_type::now() + std::chrono::milliseconds(1)));
    got = collect(got);
  }
  *nr = got;
  return ok();
}
CUfileError_t cuFileBatchIOCancel(CUfileBatchHandle_t b) {
  std::lock_guard lock(st().mutex);
  auto it = st().batches.find(b);
  if (it == st().batches.end()) return fail(5001 + 22);
  ++st().cancels;
  for (auto& e : it->second.entries) {
    if (e.status == CUFILE_WAITING) e.status = CUFILE_CANCELED;
  }
  st().cv.notify_all();
  return ok();
}
void cuFileBatchIODestroy(CUfileBatchHandle_t b) {
  std::lock_guard lock(st().mutex);
  st().batches.erase(b);
}

}  // extern "C"
