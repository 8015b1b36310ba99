// The one way gdskit turns JSON into text for --json output: bytes that are not valid UTF-8 (a Latin-1 file
// name, a byte from a captured file) become U+FFFD instead of aborting the output.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gdskit {

/// `j` serialized with nlohmann's dump and error_handler_t::replace; `indent` as for dump (-1: one line).
/// Always valid JSON; never throws on string content.
std::string json_text(const nlohmann::json& j, int indent = 2);

}  // namespace gdskit
