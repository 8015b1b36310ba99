// The cuFile paths (gds and compat): parallel chunks through cuFileRead/cuFileWrite on a registered handle.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/open_file.hpp"
#include "gdskit/buffer.hpp"
#include "shim/cufile.hpp"

namespace gdskit::gpu {

/// Moves [offset, offset+nbytes) between the file and device memory `buf` with cuFile. Reads return fewer
/// bytes only at end of file. Throws gdskit::error (cufile, cuda or errno category) naming the range.
std::size_t cufile_transfer(const engine::open_file& f, bool write, buffer_view buf, std::size_t nbytes,
                            std::uint64_t offset);

/// The file's cuFile handle, registered on first use (and the driver opened in the mode GDSKIT_MODE asks for).
/// Throws gdskit::error (cufile or errno category) naming the file.
shim::CUfileHandle_t cufile_handle_for(const engine::open_file& f);

}  // namespace gdskit::gpu
