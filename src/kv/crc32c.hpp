// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) in two implementations that must agree: a portable one
// (eight lookup tables, eight bytes per step) and one on the x86 crc32 instruction (SSE4.2), chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gdskit::kv::detail {

/// The portable implementation (any CPU).
std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept;
/// The crc32-instruction implementation; only call it when crc32c_hardware() is true.
std::uint32_t crc32c_instruction(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept;
/// Whether this CPU has the crc32 instruction (SSE4.2), probed once.
bool crc32c_hardware() noexcept;

}  // namespace gdskit::kv::detail
