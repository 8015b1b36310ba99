// The parts of buffers.cpp that take the driver table as an argument, so that tests can hand them a fake one.
#pragma once

#include <cstddef>

#include "gdskit/buffer.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit::gpu {

/// describe_pointer() against driver table `a` (nullptr: no driver). Host memory is what the driver does not
/// know: no driver, or CUDA_ERROR_INVALID_VALUE for the pointer. Any other driver error throws gdskit::error
/// (cuda category); a range larger than the allocation throws EINVAL; a null pointer EFAULT.
buffer_view describe_pointer_with(const shim::cuda_api* a, void* ptr, std::size_t nbytes);

}  // namespace gdskit::gpu
