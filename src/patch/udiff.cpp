// A unified diff for `gdskit patch diff`. The patch changes single lines, so a line-by-line comparison of two
// texts with the same number of lines is enough; texts whose line counts differ fall back to one whole-file hunk.
#include <algorithm>
#include <fmt/format.h>

#include "patch/patch.hpp"

namespace gdskit::patch {
namespace {

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

std::string unified_diff(std::string_view old_text, std::string_view new_text, std::string_view old_label,
                         std::string_view new_label) {
  if (old_text == new_text) return {};
  const auto a = lines_of(old_text);
  const auto b = lines_of(new_text);
  std::string out = fmt::format("--- {}\n+++ {}\n", old_label, new_label);
  if (a.size() != b.size()) {
    out += fmt::format("@@ -1,{} +1,{} @@\n", a.size(), b.size());
    for (auto l : a) out += fmt::format("-{}\n", l);
    for (auto l : b) out += fmt::format("+{}\n", l);
    return out;
  }
  constexpr std::size_t context = 3;
  std::vector<std::size_t> changed;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) changed.push_back(i);
  }
  std::size_t k = 0;
  while (k < changed.size()) {
    // Hunks whose context would touch merge into one.
    std::size_t end = k;
    while (end + 1 < changed.size() && changed[end + 1] - changed[end] <= 2 * context) ++end;
    const std::size_t first = changed[k] >= context ? changed[k] - context : 0;
    const std::size_t last = std::min(a.size() - 1, changed[end] + context);
    const std::size_t count = last - first + 1;
    out += fmt::format("@@ -{},{} +{},{} @@\n", first + 1, count, first + 1, count);
    for (std::size_t i = first; i <= last; ++i) {
      if (a[i] == b[i]) {
        out += fmt::format(" {}\n", a[i]);
      } else {
        out += fmt::format("-{}\n+{}\n", a[i], b[i]);
      }
    }
    k = end + 1;
  }
  return out;
}

}  // namespace gdskit::patch
