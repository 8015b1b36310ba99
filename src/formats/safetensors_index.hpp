// A sharded checkpoint's index (*.safetensors.index.json, {"weight_map": {name: file}}): text from outside,
// read with bounded nesting, its names and file names escaped wherever a message shows them.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "gdskit/safetensors.hpp"

namespace gdskit::formats {

/// The shards that the index text `json` names, each a file in the folder of `index` (the path the text came
/// from, named in errors) with the names the index assigns to it, in file-name order. Throws gdskit::error
/// EBADMSG for text that is not JSON, nests deeper than max_index_json_depth, has no "weight_map" object or an
/// empty one, or maps a name to anything but a relative file name inside the folder. Linear in the text.
std::vector<safetensors::shard> parse_index(std::string_view json, const std::filesystem::path& index);

/// parse_index() of the file `index` (a regular file of at most safetensors::max_header_bytes; open_regular's
/// errors otherwise).
std::vector<safetensors::shard> read_index(const std::filesystem::path& index);

}  // namespace gdskit::formats
