// The plan's one line in the default output of bench, verify and load: the route and its first reason in a few
// words; all reasons with -v and in --json.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gdskit::tools {

/// At most this many characters come from the first reason.
inline constexpr std::size_t k_brief_reason_chars = 60;

/// The first of `reasons` cut to its leading words: the text before its first " (" or ": ", at most
/// k_brief_reason_chars characters (cut at a space, with "..."). Empty when there is none.
std::string brief_reason(const std::vector<std::string>& reasons);

/// "buffer is host memory; 2 more reasons with -v"; `verbose` gives every reason instead.
std::string reasons_text(const std::vector<std::string>& reasons, bool verbose);

/// "host (buffer is host memory; 2 more reasons with -v)": the route and reasons_text() in parentheses.
std::string path_line(std::string_view route, const std::vector<std::string>& reasons, bool verbose);

}  // namespace gdskit::tools
