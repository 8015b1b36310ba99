// JSON read from files the doctor does not control (cufile.json, a probe process's report line): parsed with a
// bound on nesting, because what is done with a parsed document later (copying a value, printing it) recurses
// once per level and a document nested a million levels deep would overflow the stack.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gdskit::doctor {

/// Deepest nesting of arrays and objects accepted. cufile.json is three levels deep.
inline constexpr int max_json_depth = 64;

/// Parses `text` (comments allowed when `comments`). Returns a discarded value and sets `why` ("nested deeper
/// than 64 levels", "not valid JSON") when it cannot be used. Never throws.
nlohmann::json parse_json_bounded(std::string_view text, bool comments, std::string& why);

}  // namespace gdskit::doctor
