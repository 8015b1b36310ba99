// The CUDA driver API (libcuda.so.1), loaded at run time. Declarations are our own: the build needs no CUDA
// header; tests/gpu/abi_check.cpp compares them with cuda.h where it exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdskit::shim {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmod_st;
struct CUfunc_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr unsigned MEMHOSTALLOC_PORTABLE = 0x01;
inline constexpr unsigned MEMHOSTREGISTER_PORTABLE = 0x01;
inline constexpr unsigned MEMHOSTREGISTER_DEVICEMAP = 0x02;
inline constexpr unsigned CU_EVENT_BLOCKING_SYNC = 0x1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
// CUpointer_attribute values.
inline constexpr int CU_POINTER_ATTRIBUTE_CONTEXT = 1;
inline constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr int CU_POINTER_ATTRIBUTE_IS_MANAGED = 8;
inline constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;
// CUmemorytype values.
inline constexpr unsigned CU_MEMORYTYPE_HOST = 1;
inline constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
inline constexpr unsigned CU_MEMORYTYPE_UNIFIED = 4;
// CUdevice_attribute values.
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33;
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34;
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50;

// Batched copies (cuMemcpyBatchAsync_v2, CUDA 13's signature).
struct CUmemLocation {
  int type;  // CUmemLocationType; 0 (invalid) = no hint
  int id;
};
struct CUmemcpyAttributes {
  int srcAccessOrder;  // CUmemcpySrcAccessOrder
  CUmemLocation srcLocHint;
  CUmemLocation dstLocHint;
  unsigned flags;
};
inline constexpr int CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1;
using CUhostFn = void (*)(void* user_data);
// cuStreamWaitValue32 flags.
inline constexpr unsigned CU_STREAM_WAIT_VALUE_GEQ = 0x0;
// cuStreamWriteValue64 flags: the default puts a memory barrier before the write (the stream's earlier writes
// are visible once the value is).
inline constexpr unsigned CU_STREAM_WRITE_VALUE_DEFAULT = 0x0;
inline constexpr unsigned CU_MEMHOSTALLOC_DEVICEMAP = 0x02;

/// Function table of libcuda.so.1. Every pointer is non-null once load() succeeded, except those marked
/// optional.
struct cuda_api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(std::size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, std::size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemHostRegister)(void*, std::size_t, unsigned);
  CUresult (*cuMemHostUnregister)(void*);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, std::size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, std::size_t);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, std::size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, std::size_t, CUstream);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, std::size_t);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  // Optional: nullptr when the driver lacks them (detected by dlsym, never by version).
  CUresult (*cuMemcpyBatchAsync)(CUdeviceptr* dsts, CUdeviceptr* srcs, std::size_t* sizes, std::size_t count,
                                 CUmemcpyAttributes* attrs, std::size_t* attr_idxs, std::size_t num_attrs, CUstream);
  CUresult (*cuLaunchHostFunc)(CUstream, CUhostFn, void*);
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, unsigned value, unsigned flags);
  CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, std::uint64_t value, unsigned flags);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned flags);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*cuStreamQuery)(CUstream);
  // Kernels from PTX (all three, or none bound).
  CUresult (*cuModuleLoadData)(CUmodule*, const void* image);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char* name);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                             unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream, void** params,
                             void** extra);
};

/// Why dlopen of `library` just failed, said once: "<library> not found<when_missing>" when the loader found no
/// such file, else "<library> could not be loaded: <the loader's text>". Call right after the failed dlopen.
std::string dlopen_failure(const char* library, const char* when_missing = "");

/// The loaded driver API, or nullptr with `reason` set ("libcuda.so.1 not found (no NVIDIA driver)",
/// "cuInit: ...").
/// Loads and calls cuInit(0) once per process; thread-safe.
const cuda_api* cuda(std::string* reason = nullptr);

/// The loaded driver API; throws gdskit::error (ENODEV) with the reason when no GPU is usable.
const cuda_api& cuda_or_throw();

/// "CUDA_ERROR_OUT_OF_MEMORY" etc. via cuGetErrorName, or the number.
std::string cuda_error_name(CUresult r);

/// Throws gdskit::error (cuda category) naming `what` when r != CUDA_SUCCESS.
void check_cuda(CUresult r, const char* what);

/// The primary context of `device`, retained for the process lifetime. Throws gdskit::error when the device
/// does not exist or no driver is usable.
CUcontext primary_context(int device);

/// Makes the primary context of `device` current on the calling thread and leaves it so. Throws
/// gdskit::error when the device does not exist or no driver is usable. src/gpu uses gpu::context_guard,
/// which restores the caller's context.
void use_device(int device);

}  // namespace gdskit::shim
