// The streaming routes: one large range (or a gathered write) between a file and GPU memory, through the path
// the planner picked: the staged pipeline on pinned lanes, or cuFile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/open_file.hpp"
#include "engine/transfer/route.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/path.hpp"

namespace gdskit::engine {

/// Moves [offset, offset+nbytes) between `f` and device (or managed) memory `buf`, whose range the caller has
/// checked, through `path` (gds or compat: cuFile; otherwise staged). Reads return fewer bytes only at end of
/// file. Throws gdskit::error naming the range.
std::size_t device_transfer(gpu_backend& gpu, const open_file& f, data_path path, bool write, buffer_view buf,
                            std::size_t nbytes, std::uint64_t offset);

/// Writes every extent (device or managed memory of one device, checked by the caller, sorted by file offset)
/// as one transfer: one schedule and, on the staged path, one pipeline. Returns the bytes written or throws.
std::size_t device_write_gather(gpu_backend& gpu, const open_file& f, data_path path,
                                std::span<const write_extent> extents, const gather_options& options);

/// Writes every extent (host memory, checked by the caller, sorted by file offset, on a file opened with
/// O_DIRECT) through the staged pipeline with memory copies into aligned slots: extents that follow one another
/// in the file are written as one range, so their joins fall inside aligned O_DIRECT requests instead of small
/// buffered writes, at the staged path's scheduled depth and request size. Returns the bytes written or throws.
std::size_t host_write_gather(const open_file& f, std::span<const write_extent> extents, const gather_options& options);

}  // namespace gdskit::engine
