// The one check every entry point makes before it touches a file: a range must fit in off_t.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "gdskit/error.hpp"

namespace gdskit::engine {

/// The largest file offset the kernel takes (off_t is signed 64-bit).
inline constexpr std::uint64_t max_file_offset = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// Throws gdskit::error unless [offset, offset + nbytes) lies within [0, 2^63 - 1]: EINVAL for an offset past
/// the limit or a read that would end past it, EFBIG for a write that would. Every planner's arithmetic
/// (offset + nbytes, rounding up to the alignment) relies on this having been checked: within the limit it
/// cannot wrap.
inline void check_file_range(std::string_view op, std::string_view path, bool write, std::uint64_t offset,
                             std::size_t nbytes) {
  if (offset > max_file_offset) {
    throw error(errno_code(EINVAL), op, path, -1, nbytes, fmt::format("offset {} is past the largest file offset", offset));
  }
  if (nbytes > max_file_offset - offset) {
    throw error(errno_code(write ? EFBIG : EINVAL), op, path, static_cast<std::int64_t>(offset), nbytes,
                "the range ends past the largest file offset (2^63 - 1)");
  }
}

}  // namespace gdskit::engine
