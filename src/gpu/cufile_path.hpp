// The cuFile paths (gds and compat): parallel chunks through cuFileRead/cuFileWrite on a registered handle.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/open_file.hpp"
#include "gdskit/buffer.hpp"

namespace gdskit::gpu {

/// Moves [offset, offset+nbytes) between the file and device memory `buf` with cuFile. Reads return fewer
/// bytes only at end of file. Throws gdskit::error (cufile, cuda or errno category) naming the range.
std::size_t cufile_transfer(const engine::open_file& f, bool write, buffer_view buf, std::size_t nbytes,
                            std::uint64_t offset);

}  // namespace gdskit::gpu
