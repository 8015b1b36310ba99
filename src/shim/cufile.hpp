// cuFile (libcufile.so.0), loaded at run time with our own ABI declarations (facts: cuFile 1.9-1.15 headers,
// x86_64 LP64). tests/gpu/abi_test.cpp checks sizes, offsets and enum values against cufile.h where it exists.
#pragma once

#include <sys/types.h>

#include <ctime>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include "shim/cuda_driver.hpp"

namespace gdskit::shim {

struct CUfileError_t {
  int err;     // CUfileOpError: 0 success, 5001.. failures
  int cu_err;  // CUresult, meaningful when err == 5011
};

inline constexpr int CU_FILE_SUCCESS = 0;
inline constexpr int CU_FILE_DRIVER_NOT_INITIALIZED = 5001;
inline constexpr int CU_FILE_CUDA_DRIVER_ERROR = 5011;
inline constexpr int CU_FILE_HANDLE_NOT_REGISTERED = 5027;
inline constexpr int CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1;

struct CUfileDescr_t {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

struct CUfileDrvProps_t {
  struct {
    unsigned major_version;
    unsigned minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned dstatusflags;
    unsigned dcontrolflags;
  } nvfs;
  unsigned fflags;
  unsigned max_device_cache_size;
  unsigned per_buffer_cache_size;
  unsigned max_device_pinned_mem_size;
  unsigned max_batch_io_size;
  unsigned max_batch_io_timeout_msecs;
};

using CUfileHandle_t = void*;

// Bit positions in CUfileDrvProps_t::nvfs.dstatusflags.
inline constexpr unsigned CU_FILE_NVME_SUPPORTED = 4;
inline constexpr unsigned CU_FILE_NVME_P2P_SUPPORTED = 11;
// Bit positions in dcontrolflags.
inline constexpr unsigned CU_FILE_ALLOW_COMPAT_MODE = 1;

// Parameter enums (cuFile >= 1.14), passed as int.
inline constexpr int CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = 1;
inline constexpr int CUFILE_PARAM_FORCE_COMPAT_MODE = 2;

// Statistics (level 3). The structs grow between releases: we pass an oversized zeroed buffer and read the
// prefix whose offsets are known (cuFile 1.15: per-GPU array at 1032, each 248 bytes).
inline constexpr std::size_t kStatsL3BufferBytes = 64 * 1024;
inline constexpr std::size_t kStatsL1ReadBytesOffset = 96;
inline constexpr std::size_t kStatsL3NumGpusOffset = 1024;
inline constexpr std::size_t kStatsL3PerGpuOffset = 1032;
inline constexpr std::size_t kStatsPerGpuBytes = 248;
inline constexpr std::size_t kPerGpuNTotalReads = 48;
inline constexpr std::size_t kPerGpuNP2pReads = 56;
inline constexpr std::size_t kPerGpuNNvfsReads = 64;
inline constexpr std::size_t kPerGpuNPosixReads = 72;
inline constexpr std::size_t kPerGpuNTotalWrites = 152;
inline constexpr std::size_t kPerGpuNP2pWrites = 160;
inline constexpr std::size_t kPerGpuNNvfsWrites = 168;
inline constexpr std::size_t kPerGpuNPosixWrites = 176;

// The batch API (cuFile 1.2+; layouts of cufile.h 1.9-1.15, checked by tests/gpu/abi_check.cpp).
using CUfileBatchHandle_t = void*;
inline constexpr int CUFILE_READ = 0;
inline constexpr int CUFILE_WRITE = 1;
inline constexpr int CUFILE_BATCH = 1;
// CUfileStatus_t
inline constexpr int CUFILE_WAITING = 0x01;
inline constexpr int CUFILE_PENDING = 0x02;
inline constexpr int CUFILE_INVALID = 0x04;
inline constexpr int CUFILE_CANCELED = 0x08;
inline constexpr int CUFILE_COMPLETE = 0x10;
inline constexpr int CUFILE_TIMEOUT = 0x20;
inline constexpr int CUFILE_FAILED = 0x40;
/// Entries in one cuFile batch: the library's default io_batchsize, and the most gdskit ever asks for.
inline constexpr unsigned k_cufile_batch_max = 128;

struct CUfileIOParams_t {
  int mode;  // CUfileBatchMode_t: CUFILE_BATCH
  union {
    struct {
      void* devPtr_base;
      off_t file_offset;
      off_t devPtr_offset;
      std::size_t size;
    } batch;
  } u;
  CUfileHandle_t fh;
  int opcode;  // CUfileOpcode_t
  void* cookie;
};

struct CUfileIOEvents_t {
  void* cookie;
  int status;        // CUfileStatus_t
  std::size_t ret;   // bytes, or a negative error stored in a size_t
};

struct cufile_api {
  CUfileError_t (*cuFileDriverOpen)();
  CUfileError_t (*cuFileDriverClose)();  // cuFileDriverClose_v2 where exported
  CUfileError_t (*cuFileDriverGetProperties)(CUfileDrvProps_t*);
  CUfileError_t (*cuFileHandleRegister)(CUfileHandle_t*, CUfileDescr_t*);
  void (*cuFileHandleDeregister)(CUfileHandle_t);
  CUfileError_t (*cuFileBufRegister)(const void*, std::size_t, int);
  CUfileError_t (*cuFileBufDeregister)(const void*);
  ssize_t (*cuFileRead)(CUfileHandle_t, void*, std::size_t, off_t, off_t);
  ssize_t (*cuFileWrite)(CUfileHandle_t, const void*, std::size_t, off_t, off_t);
  // optional (nullptr when the library lacks them)
  CUfileError_t (*cuFileGetVersion)(int*);
  CUfileError_t (*cuFileSetParameterBool)(int, bool);
  CUfileError_t (*cuFileGetParameterBool)(int, bool*);
  CUfileError_t (*cuFileSetStatsLevel)(int);
  CUfileError_t (*cuFileStatsStart)();
  CUfileError_t (*cuFileStatsReset)();
  CUfileError_t (*cuFileGetStatsL3)(void*);
  CUfileError_t (*cuFileBatchIOSetUp)(CUfileBatchHandle_t*, unsigned nr);
  CUfileError_t (*cuFileBatchIOSubmit)(CUfileBatchHandle_t, unsigned nr, CUfileIOParams_t*, unsigned flags);
  CUfileError_t (*cuFileBatchIOGetStatus)(CUfileBatchHandle_t, unsigned min_nr, unsigned* nr, CUfileIOEvents_t*,
                                          struct timespec* timeout);
  CUfileError_t (*cuFileBatchIOCancel)(CUfileBatchHandle_t);
  void (*cuFileBatchIODestroy)(CUfileBatchHandle_t);
  /// Whether the library has the batch API (every batch entry point was found).
  bool has_batch() const noexcept {
    return cuFileBatchIOSetUp && cuFileBatchIOSubmit && cuFileBatchIOGetStatus && cuFileBatchIOCancel &&
           cuFileBatchIODestroy;
  }
};

/// The loaded cuFile API, or nullptr with `reason` ("libcufile.so.0 not found", ...). Loading does not
/// open the driver.
const cufile_api* cufile(std::string* reason = nullptr);

/// The cuFile API of the library at `path`, without checking for a CUDA driver first: tests load a stand-in
/// library this way. False with `reason` when it cannot be loaded or lacks a core symbol.
bool load_cufile_at(const char* path, cufile_api& api, std::string* reason = nullptr);

/// cuFile's version (1000*major + 10*minor), 0 when unknown.
int cufile_version();

/// Opens a cuFile driver once: later calls return the first call's status, and the driver keeps the mode the
/// first call asked for (cuFile reads its mode when the driver opens). `compat` forces cuFile's compat mode
/// before the open (cuFileSetParameterBool, or CUFILE_FORCE_COMPAT_MODE where that call is missing).
/// Thread-safe. The process has one (cufile_driver_open); tests make their own for a stand-in library.
class driver_opener {
 public:
  /// The cuFile status of the open (0 = open).
  int open(const cufile_api& api, bool compat);
  /// Whether the open succeeded.
  bool opened() const noexcept;
  /// Whether the driver was opened in forced compat mode (false before it is open).
  bool compat() const noexcept;

 private:
  mutable std::mutex mutex_;
  bool tried_ = false;
  int status_ = 0;
  bool compat_ = false;
};

/// Opens this process's cuFile driver (driver_opener above) with the loaded library; a status other than 0
/// when it cannot be loaded or opened.
int cufile_driver_open(bool compat = false);
/// Whether this process opened the cuFile driver (cufile_driver_open succeeded).
bool cufile_driver_opened() noexcept;
/// Whether this process's cuFile driver was opened in forced compat mode.
bool cufile_driver_compat() noexcept;

/// Per-GPU path counters from level-3 statistics (zero when stats are unavailable).
struct cufile_path_counters {
  bool available = false;
  std::uint64_t reads = 0, p2p_reads = 0, nvfs_reads = 0, posix_reads = 0;
  std::uint64_t writes = 0, p2p_writes = 0, nvfs_writes = 0, posix_writes = 0;
  std::uint64_t read_bytes = 0;
};
/// Enables level-3 statistics (before or after driver open). Returns false when the library lacks them.
bool cufile_enable_stats();
/// Sums the per-GPU counters of all GPUs.
cufile_path_counters cufile_read_counters();

/// Decodes a CUfileError_t into an error_code (cufile category; cuda category for 5011).
std::error_code cufile_status_code(CUfileError_t e);

/// Move-only owner of a cuFile file handle.
class cufile_handle {
 public:
  cufile_handle() noexcept = default;
  /// Registers `fd` with cuFile; `status` receives the cuFile result (0 on success). Never throws.
  cufile_handle(int fd, CUfileError_t& status) noexcept;
  ~cufile_handle();
  cufile_handle(cufile_handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  cufile_handle& operator=(cufile_handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  cufile_handle(const cufile_handle&) = delete;
  cufile_handle& operator=(const cufile_handle&) = delete;
  CUfileHandle_t get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  void reset() noexcept;

 private:
  CUfileHandle_t h_ = nullptr;
};

}  // namespace gdskit::shim
