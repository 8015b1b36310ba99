#include "tools/path_line.hpp"

#include <fmt/format.h>

namespace gdskit::tools {

std::string brief_reason(const std::vector<std::string>& reasons) {
  if (reasons.empty()) return {};
  std::string_view r = reasons.front();
  for (std::string_view stop : {" (", ": "}) {
    if (auto at = r.find(stop); at != std::string_view::npos && at > 0) r = r.substr(0, at);
  }
  if (r.size() <= k_brief_reason_chars) return std::string(r);
  r = r.substr(0, k_brief_reason_chars - 3);
  if (auto space = r.rfind(' '); space != std::string_view::npos && space > k_brief_reason_chars / 2) {
    r = r.substr(0, space);
  }
  return std::string(r) + "...";
}

std::string reasons_text(const std::vector<std::string>& reasons, bool verbose) {
  if (reasons.empty()) return {};
  if (verbose) return fmt::format("{}", fmt::join(reasons, "; "));
  const std::string brief = brief_reason(reasons);
  const std::size_t more = reasons.size() - 1;
  if (more > 0) return fmt::format("{}; {} more reason{} with -v", brief, more, more == 1 ? "" : "s");
  return brief.size() < reasons.front().size() ? brief + "; more with -v" : brief;
}

std::string path_line(std::string_view route, const std::vector<std::string>& reasons, bool verbose) {
  if (reasons.empty()) return std::string(route);
  return fmt::format("{} ({})", route, reasons_text(reasons, verbose));
}

}  // namespace gdskit::tools
