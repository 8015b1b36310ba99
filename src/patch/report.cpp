// Text and JSON renderings of a tree report, shared by the CLI and the tests.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_text.hpp"

#include "patch/report.hpp"

namespace gdskit::patch {

std::string_view honesty_note() noexcept {
  return "What this changes: the GPU<->GPU BAR1 P2P paths of the open kernel module (P2P overrides in "
         "_kbifInitRegistryOverrides, the BAR1 P2P HAL entries for pre-Hopper chips).\n"
         "What it does not prove: that nvidia_p2p_get_pages_persistent, the pin GPUDirect Storage uses, works on "
         "a GeForce card. None of these edits lies on that path, and the pin may still be refused (-22). Run "
         "`gdskit doctor` after loading the module: its live pin probe is the judge.\n";
}

std::string render_text(const tree_report& r, std::string_view operation) {
  std::string out;
  out += fmt::format("source:  {}\n", r.src.string());
  out += fmt::format("driver:  {}{}\n", r.facts.version.known() ? r.facts.version.text : "unknown",
                     r.facts.version_supported ? "" : " (not a checked series)");
  out += fmt::format("layout:  HAL comments {}, Bool stub _{}, pcieP2PType {}, ForceP2P atomics field {}\n",
                     r.facts.hal_comment_style, r.facts.bool_stub_suffix.empty() ? "?" : r.facts.bool_stub_suffix,
                     r.facts.has_pcie_p2p_type ? "present" : "absent", r.facts.has_atomics_field ? "yes" : "no");
  for (const auto& n : r.facts.notes) out += fmt::format("note:    {}\n", n);
  out += "\n";
  for (const auto& e : r.edits) {
    out += fmt::format("{:<9} {:<42} {}", to_string(e.state), e.id,
                       e.line ? fmt::format("{}:{}", e.file, e.line) : e.file);
    out += "\n";
    if (e.state == edit_state::original) out += fmt::format("          -> {}\n", e.applied);
    if (e.state == edit_state::applied && !e.found.empty() && e.found != e.applied)
      out += fmt::format("          now {} (apply writes {})\n", e.found, e.applied);
    if (!e.detail.empty() && e.state != edit_state::original && e.state != edit_state::applied)
      out += fmt::format("          {}\n", e.detail);
  }
  for (const auto& [file, what] : r.files) out += fmt::format("\n{}: {}", file, what);
  if (!r.files.empty()) out += "\n";
  if (r.refused) out += fmt::format("\nREFUSED ({}): {}\nNothing was written.\n", operation, r.refusal);
  return out;
}

std::string render_json(const tree_report& r) {
  nlohmann::json j;
  j["src"] = r.src.string();
  j["driver_version"] = r.facts.version.known() ? nlohmann::json(r.facts.version.text) : nlohmann::json(nullptr);
  j["version_supported"] = r.facts.version_supported;
  j["layout"] = {{"hal_comment_style", r.facts.hal_comment_style},
                 {"bool_stub_suffix", r.facts.bool_stub_suffix},
                 {"has_pcie_p2p_type", r.facts.has_pcie_p2p_type},
                 {"has_atomics_field", r.facts.has_atomics_field},
                 {"force_p2p_type_value", r.facts.force_p2p_type_value}};
  j["notes"] = r.facts.notes;
  auto& edits = j["edits"] = nlohmann::json::array();
  std::size_t counts[4] = {};
  for (const auto& e : r.edits) {
    ++counts[static_cast<int>(e.state)];
    edits.push_back({{"id", e.id},
                     {"file", e.file},
                     {"function", e.function},
                     {"state", to_string(e.state)},
                     {"line", e.line},
                     {"found", e.found},
                     {"original", e.original},
                     {"applied", e.applied},
                     {"detail", e.detail}});
  }
  j["summary"] = {{"original", counts[0]}, {"applied", counts[1]}, {"unknown", counts[2]}, {"n/a", counts[3]}};
  auto& files = j["files"] = nlohmann::json::object();
  for (const auto& [file, what] : r.files) files[file] = what;
  j["refused"] = r.refused;
  j["refusal"] = r.refusal;
  if (!r.diff.empty()) j["diff"] = r.diff;
  return json_text(j) + "\n";
}

std::string_view overall_state(const tree_report& r) {
  bool any_orig = false, any_applied = false;
  for (const auto& e : r.edits) {
    if (e.state == edit_state::unknown) return "unknown";
    any_orig |= e.state == edit_state::original;
    any_applied |= e.state == edit_state::applied;
  }
  if (any_orig && any_applied) return "partial";
  return any_applied ? "applied" : "original";
}

}  // namespace gdskit::patch
