// The count of unmappings of staging memory, over the process.
//
// Staging chunks are entered in io_uring tables of registered buffers by their address, and an entry outlives the
// batch that made it: the next batches on that thread reuse it without pinning the chunk again. The kernel keeps
// the pages an entry was made for, so an entry must never serve a later mapping that happens to get the same
// address. Whoever unmaps memory that may have served as staging counts this up first; a table that sees the
// count moved drops every entry no batch holds before it takes a new one.
#pragma once

#include <atomic>
#include <cstdint>

namespace gdskit {

inline std::atomic<std::uint64_t>& staging_unmap_epoch() noexcept {
  static std::atomic<std::uint64_t> epoch{0};
  return epoch;
}

/// Call before unmapping memory that served as staging (a pooled chunk given back to the system).
inline void staging_unmapping() noexcept { staging_unmap_epoch().fetch_add(1, std::memory_order_seq_cst); }

}  // namespace gdskit
