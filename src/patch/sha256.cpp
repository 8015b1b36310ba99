// The patcher's checksums use the one SHA-256 of the project (src/formats).
#include "formats/sha256.hpp"
#include "patch/patch.hpp"

namespace gdskit::patch {

std::string sha256_hex(std::string_view data) { return formats::sha256::hex(data.data(), data.size()); }

}  // namespace gdskit::patch
