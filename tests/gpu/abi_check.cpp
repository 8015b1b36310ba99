// Compares gdskit's own declarations of the CUDA driver and cuFile ABI with NVIDIA's headers, where those
// exist (the GPU machine). Built only when cufile.h is found; a plain program: it compiles or it fails.
#include <cuda.h>
#include <cufile.h>

#include <cstddef>
#include <cstdio>

#include "shim/cuda_driver.hpp"
#include "shim/cufile.hpp"

namespace s = gdskit::shim;

static_assert(sizeof(s::CUfileError_t) == sizeof(CUfileError_t));
static_assert(offsetof(s::CUfileError_t, cu_err) == offsetof(CUfileError_t, cu_err));
static_assert(sizeof(s::CUfileDescr_t) == sizeof(CUfileDescr_t));
static_assert(offsetof(s::CUfileDescr_t, handle) == offsetof(CUfileDescr_t, handle));
static_assert(offsetof(s::CUfileDescr_t, fs_ops) == offsetof(CUfileDescr_t, fs_ops));
static_assert(sizeof(s::CUfileDrvProps_t) == sizeof(CUfileDrvProps_t));
static_assert(offsetof(s::CUfileDrvProps_t, fflags) == offsetof(CUfileDrvProps_t, fflags));
static_assert(offsetof(s::CUfileDrvProps_t, max_batch_io_size) == offsetof(CUfileDrvProps_t, max_batch_io_size));
static_assert(offsetof(s::CUfileDrvProps_t, max_batch_io_timeout_msecs) == offsetof(CUfileDrvProps_t, max_batch_io_timeout_msecs));
static_assert(s::CU_FILE_SUCCESS == CU_FILE_SUCCESS);
static_assert(s::CU_FILE_DRIVER_NOT_INITIALIZED == CU_FILE_DRIVER_NOT_INITIALIZED);
static_assert(s::CU_FILE_CUDA_DRIVER_ERROR == CU_FILE_CUDA_DRIVER_ERROR);
static_assert(s::CU_FILE_HANDLE_NOT_REGISTERED == CU_FILE_HANDLE_NOT_REGISTERED);
static_assert(s::CU_FILE_HANDLE_TYPE_OPAQUE_FD == CU_FILE_HANDLE_TYPE_OPAQUE_FD);
static_assert(s::CU_FILE_NVME_SUPPORTED == CU_FILE_NVME_SUPPORTED);
static_assert(s::CU_FILE_ALLOW_COMPAT_MODE == CU_FILE_ALLOW_COMPAT_MODE);
#ifdef CU_FILE_NVME_P2P_SUPPORTED
static_assert(s::CU_FILE_NVME_P2P_SUPPORTED == CU_FILE_NVME_P2P_SUPPORTED);
#endif
static_assert(s::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE == CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE);
static_assert(s::CUFILE_PARAM_FORCE_COMPAT_MODE == CUFILE_PARAM_FORCE_COMPAT_MODE);
// Statistics offsets we read from the level-3 buffer.
static_assert(offsetof(CUfileStatsLevel1_t, read_bytes) == s::kStatsL1ReadBytesOffset);
static_assert(offsetof(CUfileStatsLevel3_t, num_gpus) == s::kStatsL3NumGpusOffset);
static_assert(offsetof(CUfileStatsLevel3_t, per_gpu_stats) == s::kStatsL3PerGpuOffset);
static_assert(sizeof(CUfilePerGpuStats_t) == s::kStatsPerGpuBytes);
static_assert(offsetof(CUfilePerGpuStats_t, n_total_reads) == s::kPerGpuNTotalReads);
static_assert(offsetof(CUfilePerGpuStats_t, n_p2p_reads) == s::kPerGpuNP2pReads);
static_assert(offsetof(CUfilePerGpuStats_t, n_nvfs_reads) == s::kPerGpuNNvfsReads);
static_assert(offsetof(CUfilePerGpuStats_t, n_posix_reads) == s::kPerGpuNPosixReads);
static_assert(offsetof(CUfilePerGpuStats_t, n_total_writes) == s::kPerGpuNTotalWrites);
static_assert(offsetof(CUfilePerGpuStats_t, n_p2p_writes) == s::kPerGpuNP2pWrites);
static_assert(offsetof(CUfilePerGpuStats_t, n_nvfs_writes) == s::kPerGpuNNvfsWrites);
static_assert(offsetof(CUfilePerGpuStats_t, n_posix_writes) == s::kPerGpuNPosixWrites);
static_assert(sizeof(CUfileStatsLevel3_t) <= s::kStatsL3BufferBytes);
// Batch API.
static_assert(sizeof(s::CUfileIOParams_t) == sizeof(CUfileIOParams_t));
static_assert(offsetof(s::CUfileIOParams_t, u) == offsetof(CUfileIOParams_t, u));
static_assert(offsetof(s::CUfileIOParams_t, fh) == offsetof(CUfileIOParams_t, fh));
static_assert(offsetof(s::CUfileIOParams_t, opcode) == offsetof(CUfileIOParams_t, opcode));
static_assert(offsetof(s::CUfileIOParams_t, cookie) == offsetof(CUfileIOParams_t, cookie));
static_assert(offsetof(s::CUfileIOParams_t, u.batch.devPtr_base) == offsetof(CUfileIOParams_t, u.batch.devPtr_base));
static_assert(offsetof(s::CUfileIOParams_t, u.batch.file_offset) == offsetof(CUfileIOParams_t, u.batch.file_offset));
static_assert(offsetof(s::CUfileIOParams_t, u.batch.devPtr_offset) == offsetof(CUfileIOParams_t, u.batch.devPtr_offset));
static_assert(offsetof(s::CUfileIOParams_t, u.batch.size) == offsetof(CUfileIOParams_t, u.batch.size));
static_assert(sizeof(s::CUfileIOEvents_t) == sizeof(CUfileIOEvents_t));
static_assert(offsetof(s::CUfileIOEvents_t, status) == offsetof(CUfileIOEvents_t, status));
static_assert(offsetof(s::CUfileIOEvents_t, ret) == offsetof(CUfileIOEvents_t, ret));
static_assert(s::CUFILE_READ == CUFILE_READ && s::CUFILE_WRITE == CUFILE_WRITE && s::CUFILE_BATCH == CUFILE_BATCH);
static_assert(s::CUFILE_WAITING == CUFILE_WAITING && s::CUFILE_PENDING == CUFILE_PENDING);
static_assert(s::CUFILE_INVALID == CUFILE_INVALID && s::CUFILE_CANCELED == CUFILE_CANCELED);
static_assert(s::CUFILE_COMPLETE == CUFILE_COMPLETE && s::CUFILE_TIMEOUT == CUFILE_TIMEOUT);
static_assert(s::CUFILE_FAILED == CUFILE_FAILED);
// Driver API.
static_assert(sizeof(s::CUdeviceptr) == sizeof(CUdeviceptr));
static_assert(s::CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY);
static_assert(s::MEMHOSTALLOC_PORTABLE == CU_MEMHOSTALLOC_PORTABLE);
static_assert(s::CU_EVENT_BLOCKING_SYNC == CU_EVENT_BLOCKING_SYNC);
static_assert(s::CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING);
static_assert(s::CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING);
static_assert(s::CU_POINTER_ATTRIBUTE_CONTEXT == CU_POINTER_ATTRIBUTE_CONTEXT);
static_assert(s::CU_POINTER_ATTRIBUTE_MEMORY_TYPE == CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
static_assert(s::CU_POINTER_ATTRIBUTE_IS_MANAGED == CU_POINTER_ATTRIBUTE_IS_MANAGED);
static_assert(s::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
static_assert(s::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
static_assert(s::CU_POINTER_ATTRIBUTE_RANGE_SIZE == CU_POINTER_ATTRIBUTE_RANGE_SIZE);
static_assert(s::CU_MEMORYTYPE_HOST == CU_MEMORYTYPE_HOST);
static_assert(s::CU_MEMORYTYPE_DEVICE == CU_MEMORYTYPE_DEVICE);
static_assert(s::CU_MEMORYTYPE_UNIFIED == CU_MEMORYTYPE_UNIFIED);
static_assert(s::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
static_assert(s::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID == CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
static_assert(s::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID == CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
static_assert(sizeof(s::CUmemcpyAttributes) == sizeof(CUmemcpyAttributes));
static_assert(offsetof(s::CUmemcpyAttributes, srcLocHint) == offsetof(CUmemcpyAttributes, srcLocHint));
static_assert(offsetof(s::CUmemcpyAttributes, dstLocHint) == offsetof(CUmemcpyAttributes, dstLocHint));
static_assert(offsetof(s::CUmemcpyAttributes, flags) == offsetof(CUmemcpyAttributes, flags));
static_assert(s::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
static_assert(s::CU_STREAM_WAIT_VALUE_GEQ == CU_STREAM_WAIT_VALUE_GEQ);
static_assert(s::CU_STREAM_WRITE_VALUE_DEFAULT == CU_STREAM_WRITE_VALUE_DEFAULT);
static_assert(s::CU_MEMHOSTALLOC_DEVICEMAP == CU_MEMHOSTALLOC_DEVICEMAP);
static_assert(s::MEMHOSTREGISTER_DEVICEMAP == CU_MEMHOSTREGISTER_DEVICEMAP);

int main() {
  std::puts("abi_check: gdskit's cuFile and driver declarations match cuda.h and cufile.h");
  return 0;
}
