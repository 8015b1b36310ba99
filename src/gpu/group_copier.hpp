// The batch driver's copier on a real GPU: many small copies between pinned staging and device memory issued
// as one launch (a copy kernel for small pieces, one cuMemcpyBatchAsync for the rest). A group's end is seen
// two ways, whichever comes first: the copy stream then writes the group's number into a word of mapped pinned
// memory that poll() reads without a system call, and a host function on a second stream (ordered after the
// group by an event) ends it for a driver that sleeps meanwhile; the copy stream never waits for a host
// function. Drivers without stream memory operations end groups by host functions on the copy stream.
#pragma once

#include <memory>

#include "engine/transfer/route.hpp"

namespace gdskit::gpu {

/// A group copier on `device` with its own non-blocking stream. Staging chunks come from a process-wide pool of
/// pinned chunks per device (at most 256 MiB idle), so pinning is paid once per process, not per batch. Throws
/// gdskit::error when the device cannot be used.
std::unique_ptr<engine::group_copier> make_cuda_group_copier(int device);

}  // namespace gdskit::gpu
