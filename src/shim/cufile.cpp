#include "shim/cufile.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "gdskit/error.hpp"

namespace gdskit::shim {
namespace {

struct loaded_cufile {
  cufile_api api{};
  bool ok = false;
  std::string reason;
  int version = 0;
};

template <class F>
void find(void* lib, F& slot, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (void* p = ::dlsym(lib, n)) {
      slot = reinterpret_cast<F>(p);
      return;
    }
  }
  slot = nullptr;
}

// Every entry point we know, by dlsym; false when a core one is missing.
bool bind_all(void* lib, cufile_api& a, std::string* reason) {
  find(lib, a.cuFileDriverOpen, {"cuFileDriverOpen"});
  find(lib, a.cuFileDriverClose, {"cuFileDriverClose_v2", "cuFileDriverClose"});
  find(lib, a.cuFileDriverGetProperties, {"cuFileDriverGetProperties"});
  find(lib, a.cuFileHandleRegister, {"cuFileHandleRegister"});
  find(lib, a.cuFileHandleDeregister, {"cuFileHandleDeregister"});
  find(lib, a.cuFileBufRegister, {"cuFileBufRegister"});
  find(lib, a.cuFileBufDeregister, {"cuFileBufDeregister"});
  find(lib, a.cuFileRead, {"cuFileRead"});
  find(lib, a.cuFileWrite, {"cuFileWrite"});
  find(lib, a.cuFileGetVersion, {"cuFileGetVersion"});
  find(lib, a.cuFileSetParameterBool, {"cuFileSetParameterBool"});
  find(lib, a.cuFileGetParameterBool, {"cuFileGetParameterBool"});
  find(lib, a.cuFileSetStatsLevel, {"cuFileSetStatsLevel"});
  find(lib, a.cuFileStatsStart, {"cuFileStatsStart"});
  find(lib, a.cuFileStatsReset, {"cuFileStatsReset"});
  find(lib, a.cuFileGetStatsL3, {"cuFileGetStatsL3"});
  if (!a.cuFileDriverOpen || !a.cuFileDriverClose || !a.cuFileDriverGetProperties || !a.cuFileHandleRegister ||
      !a.cuFileHandleDeregister || !a.cuFileBufRegister || !a.cuFileBufDeregister || !a.cuFileRead || !a.cuFileWrite) {
    if (reason != nullptr) *reason = "the library lacks a core cuFile symbol (cuFileDriverOpen..cuFileWrite)";
    return false;
  }
  find(lib, a.cuFileBatchIOSetUp, {"cuFileBatchIOSetUp"});
  find(lib, a.cuFileBatchIOSubmit, {"cuFileBatchIOSubmit"});
  find(lib, a.cuFileBatchIOGetStatus, {"cuFileBatchIOGetStatus"});
  find(lib, a.cuFileBatchIOCancel, {"cuFileBatchIOCancel"});
  find(lib, a.cuFileBatchIODestroy, {"cuFileBatchIODestroy"});
  return true;
}

loaded_cufile load_cufile() {
  loaded_cufile out;
  // libcufile loads libcuda itself; we make sure the driver is usable first so the reason is the driver's.
  std::string why;
  if (cuda(&why) == nullptr) {
    out.reason = "no usable CUDA driver: " + why;
    return out;
  }
  void* lib = ::dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    out.reason = dlopen_failure("libcufile.so.0");
    return out;
  }
  if (!bind_all(lib, out.api, &out.reason)) return out;
  cufile_api& a = out.api;
  if (a.cuFileGetVersion != nullptr) {
    int v = 0;
    if (a.cuFileGetVersion(&v).err == CU_FILE_SUCCESS) out.version = v;
  }
  out.ok = true;
  return out;
}

const loaded_cufile& cufile_state() {
  static const loaded_cufile s = load_cufile();
  return s;
}

std::uint64_t read_u64(const std::vector<unsigned char>& buf, std::size_t off) {
  std::uint64_t v = 0;
  std::memcpy(&v, buf.data() + off, sizeof v);
  return v;
}

}  // namespace

const cufile_api* cufile(std::string* reason) {
  const loaded_cufile& s = cufile_state();
  if (!s.ok) {
    if (reason != nullptr) *reason = s.reason;
    return nullptr;
  }
  return &s.api;
}

int cufile_version() { return cufile_state().version; }

bool load_cufile_at(const char* path, cufile_api& api, std::string* reason) {
  void* lib = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const std::string why = dlopen_failure(path);
    if (reason != nullptr) *reason = why;
    return false;
  }
  api = cufile_api{};
  return bind_all(lib, api, reason);
}

int driver_opener::open(const cufile_api& api, bool compat) {
  std::lock_guard lock(mutex_);
  if (tried_) return status_;
  tried_ = true;
  if (compat) {
    const bool set = api.cuFileSetParameterBool != nullptr &&
                     api.cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, true).err == CU_FILE_SUCCESS;
    if (!set) ::setenv("CUFILE_FORCE_COMPAT_MODE", "true", 1);
  }
  status_ = api.cuFileDriverOpen().err;
  compat_ = compat && status_ == CU_FILE_SUCCESS;
  return status_;
}

bool driver_opener::opened() const noexcept {
  std::lock_guard lock(mutex_);
  return tried_ && status_ == CU_FILE_SUCCESS;
}

bool driver_opener::compat() const noexcept {
  std::lock_guard lock(mutex_);
  return compat_;
}

namespace {
driver_opener& process_driver() {
  static driver_opener* d = new driver_opener();  // never destroyed: asked about during exit
  return *d;
}

// At a normal exit the process's driver is closed before libcufile's own teardown runs (this handler is
// registered after the library was loaded, so it runs first): left open, the library's threads were seen to
// read its freed state as it tore down, and the process died with SIGSEGV after its work was done.
void close_process_driver() {
  if (const cufile_api* a = cufile(); a != nullptr && process_driver().opened()) a->cuFileDriverClose();
}
}  // namespace

int cufile_driver_open(bool compat) {
  const cufile_api* a = cufile();
  if (a == nullptr) return CU_FILE_DRIVER_NOT_INITIALIZED;
  const int st = process_driver().open(*a, compat);
  static std::once_flag closing;
  if (st == CU_FILE_SUCCESS) std::call_once(closing, [] { std::atexit(close_process_driver); });
  return st;
}

bool cufile_driver_opened() noexcept { return process_driver().opened(); }

bool cufile_driver_compat() noexcept { return process_driver().compat(); }

bool cufile_enable_stats() {
  const cufile_api* a = cufile();
  if (a == nullptr || a->cuFileSetStatsLevel == nullptr || a->cuFileGetStatsL3 == nullptr) return false;
  if (a->cuFileSetStatsLevel(3).err != CU_FILE_SUCCESS) return false;
  if (a->cuFileStatsStart != nullptr) a->cuFileStatsStart();
  return true;
}

cufile_path_counters cufile_read_counters() {
  cufile_path_counters c;
  const cufile_api* a = cufile();
  if (a == nullptr || a->cuFileGetStatsL3 == nullptr) return c;
  std::vector<unsigned char> buf(kStatsL3BufferBytes, 0);
  if (a->cuFileGetStatsL3(buf.data()).err != CU_FILE_SUCCESS) return c;
  c.available = true;
  c.read_bytes = read_u64(buf, kStatsL1ReadBytesOffset);
  std::uint32_t ngpus = 0;
  std::memcpy(&ngpus, buf.data() + kStatsL3NumGpusOffset, sizeof ngpus);
  ngpus = std::min<std::uint32_t>(ngpus, 16);
  for (std::uint32_t g = 0; g < ngpus; ++g) {
    std::size_t base = kStatsL3PerGpuOffset + g * kStatsPerGpuBytes;
    c.reads += read_u64(buf, base + kPerGpuNTotalReads);
    c.p2p_reads += read_u64(buf, base + kPerGpuNP2pReads);
    c.nvfs_reads += read_u64(buf, base + kPerGpuNNvfsReads);
    c.posix_reads += read_u64(buf, base + kPerGpuNPosixReads);
    c.writes += read_u64(buf, base + kPerGpuNTotalWrites);
    c.p2p_writes += read_u64(buf, base + kPerGpuNP2pWrites);
    c.nvfs_writes += read_u64(buf, base + kPerGpuNNvfsWrites);
    c.posix_writes += read_u64(buf, base + kPerGpuNPosixWrites);
  }
  return c;
}

std::error_code cufile_status_code(CUfileError_t e) {
  if (e.err == CU_FILE_CUDA_DRIVER_ERROR && e.cu_err != 0) return cuda_code(e.cu_err);
  return cufile_code(e.err);
}

cufile_handle::cufile_handle(int fd, CUfileError_t& status) noexcept {
  status = {CU_FILE_DRIVER_NOT_INITIALIZED, 0};
  const cufile_api* a = cufile();
  if (a == nullptr) return;
  CUfileDescr_t d;
  std::memset(&d, 0, sizeof d);
  d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  d.handle.fd = fd;
  status = a->cuFileHandleRegister(&h_, &d);
  if (status.err != CU_FILE_SUCCESS) h_ = nullptr;
}

cufile_handle::~cufile_handle() { reset(); }

void cufile_handle::reset() noexcept {
  if (h_ != nullptr) {
    if (const cufile_api* a = cufile()) a->cuFileHandleDeregister(h_);
    h_ = nullptr;
  }
}

}  // namespace gdskit::shim
