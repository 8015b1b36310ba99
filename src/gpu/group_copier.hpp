// The batch driver's copier on a real GPU: many small copies between pinned staging and device memory issued
// as one cuMemcpyBatchAsync (one launch), completion reported by a host function on the copier's stream.
#pragma once

#include <memory>

#include "engine/transfer/route.hpp"

namespace gdskit::gpu {

/// A group copier on `device` with its own non-blocking stream. Staging chunks come from a process-wide pool of
/// pinned chunks per device (at most 256 MiB idle), so pinning is paid once per process, not per batch. Throws
/// gdskit::error when the device cannot be used.
std::unique_ptr<engine::group_copier> make_cuda_group_copier(int device);

}  // namespace gdskit::gpu
