// CRC32C (Castagnoli), the checksum of iSCSI, ext4 metadata and NVMe protection information: what batches
// verify and report per range (batch_options::checksum) and what the KV-cache store keeps per block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gdskit {

/// CRC32C of `nbytes` at `data`, continuing from `crc` (the value of the bytes before them; 0 to start).
/// Uses the CPU's crc32 instruction where it has one (checked once at run time), else tables.
/// crc32c("123456789", 9) == 0xE3069283.
std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc = 0) noexcept;

}  // namespace gdskit
