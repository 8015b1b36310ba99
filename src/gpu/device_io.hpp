// Transfers between a file and device memory, through the path the planner picks (cuFile or staged).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"

namespace gdskit::gpu {

/// Moves [offset, offset+nbytes) between `file` and device (or managed) memory `buf`, whose range the caller
/// has checked. Reads return fewer bytes only at end of file. Throws gdskit::error: ENODEV when no GPU is
/// usable, else what the path throws, naming the range.
std::size_t device_transfer(const file_handle& file, bool write, buffer_view buf, std::size_t nbytes,
                            std::uint64_t offset);

/// Writes every extent (device or managed memory of one device, checked by the caller, sorted by file offset)
/// as one transfer: one schedule and, on the staged path, one pipeline. Returns the bytes written or throws.
std::size_t device_write_gather(const file_handle& file, std::span<const write_extent> extents,
                                const gather_options& options);

/// Writes every extent (host memory, checked by the caller, sorted by file offset, on a file opened with
/// O_DIRECT) through the staged pipeline with memory copies into aligned slots: extents that follow one another
/// in the file are written as one range, so their joins fall inside aligned O_DIRECT requests instead of small
/// buffered writes, at the staged path's scheduled depth and request size. Returns the bytes written or throws.
std::size_t host_write_gather(const file_handle& file, std::span<const write_extent> extents,
                              const gather_options& options);

}  // namespace gdskit::gpu
