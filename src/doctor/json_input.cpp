#include "doctor/json_input.hpp"

#include <fmt/format.h>

namespace gdskit::doctor {

nlohmann::json parse_json_bounded(std::string_view text, bool comments, std::string& why) {
  using json = nlohmann::json;
  why.clear();
  bool too_deep = false;
  // The parser itself keeps its own stack; the callback refuses to build any value below the bound, so the
  // document that comes back is never deeper than it.
  const json::parser_callback_t bound = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_json_depth) {
      too_deep = true;
      return false;
    }
    return !too_deep;
  };
  json j = json::parse(text.begin(), text.end(), bound, /*allow_exceptions=*/false, comments);
  if (too_deep) {
    why = fmt::format("nested deeper than {} levels", max_json_depth);
    return json(json::value_t::discarded);
  }
  if (j.is_discarded()) why = "not valid JSON";
  return j;
}

}  // namespace gdskit::doctor
