// Page-cache residency: reads of data already in memory go through the page cache (fast, no disk), reads of
// data that is not go through O_DIRECT (no double copy, no cache pollution).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/file_impl.hpp"

namespace gdskit::engine {

/// Fraction (0..1) of the pages of [offset, offset+nbytes) that are in the page cache; -1 when unknown.
double resident_fraction(int fd, std::uint64_t offset, std::size_t nbytes);

/// True when a read of this range should use the buffered descriptor: the file has one and at least half
/// the range is resident, unless GDSKIT_DIRECT=on forces O_DIRECT.
bool prefer_page_cache(const file_handle::impl& f, std::uint64_t offset, std::size_t nbytes);

}  // namespace gdskit::engine
