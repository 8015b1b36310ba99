// Transfers between a file and device memory, through the path the planner picks (cuFile or staged).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"

namespace gdskit::gpu {

/// Moves [offset, offset+nbytes) between `file` and device (or managed) memory `buf`, whose range the caller
/// has checked. Reads return fewer bytes only at end of file. Throws gdskit::error: ENODEV when no GPU is
/// usable, else what the path throws, naming the range.
std::size_t device_transfer(const file_handle& file, bool write, buffer_view buf, std::size_t nbytes,
                            std::uint64_t offset);

}  // namespace gdskit::gpu
