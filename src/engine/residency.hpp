// Page-cache residency: reads of data already in memory go through the page cache (fast, no disk), reads of
// data that is not go through O_DIRECT (no double copy, no cache pollution).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/open_file.hpp"

namespace gdskit::engine {

/// Fraction (0..1) of the pages of [offset, offset+nbytes) of the file that are in the page cache; -1 when
/// unknown (write-only handle, mapping refused).
double resident_fraction(const open_file& f, std::uint64_t offset, std::size_t nbytes);

/// Like resident_fraction, but for large ranges samples 32 windows of 256 KiB spread over the range instead
/// of asking about every page (a full scan of 8 GiB costs tens of milliseconds).
double sampled_resident_fraction(const open_file& f, std::uint64_t offset, std::size_t nbytes);

/// Unmaps the handle's residency mapping (called when the handle closes).
void release_residency_map(const open_file& f) noexcept;

/// True when a read of this range should use the buffered descriptor: the file has one and at least half
/// the range is resident (sampled for large ranges), unless GDSKIT_DIRECT=on forces O_DIRECT. The host engine
/// asks per chunk, the staged path per piece and once per request to size its lanes.
bool prefer_page_cache(const open_file& f, std::uint64_t offset, std::size_t nbytes);

}  // namespace gdskit::engine
