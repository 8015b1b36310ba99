// Facts of the safetensors loader that other parts plan with (the distributed loader in Python reads them
// through the extension), so that they are not written twice.
#pragma once

#include <cstdint>

namespace gdskit::formats {

/// Strided segments at least this large are read one by one straight into their destination; smaller ones are
/// gathered through the staging buffer, since many tiny requests cost more than the bytes skipped between them.
inline constexpr std::uint64_t direct_segment_bytes = std::uint64_t{256} << 10;

}  // namespace gdskit::formats
