// Finding the edits in the text of the two driver files, and rewriting them. Pure functions on strings: the
// tree-level code (tree.cpp) and the fuzz target both go through here.
#include <algorithm>
#include <array>
#include <charconv>
#include <fmt/format.h>

#include "patch/patch.hpp"

namespace gdskit::patch {
namespace {

struct line_ref {
  std::size_t begin = 0;  // offset of the first character of the line
  std::size_t end = 0;    // offset one past the last character before '\n' (a '\r' stays in the line)
};

std::vector<line_ref> split_lines(std::string_view text) {
  std::vector<line_ref> lines;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back({pos, nl});
    pos = nl + 1;
  }
  return lines;
}

std::string_view trim(std::string_view s) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view line_text(std::string_view text, const line_ref& l) { return text.substr(l.begin, l.end - l.begin); }

std::string lines_list(const std::vector<std::size_t>& idx) {
  std::string out;
  for (std::size_t i : idx) out += (out.empty() ? "" : ", ") + std::to_string(i + 1);
  return out;
}

// The five HAL entries whose default branch is pointed at the _GH100 implementation.
struct hal_entry {
  std::string_view name;
  bool bool_stub;  // default is the NvBool stub (_bf6dfa / _d69453) rather than the NV_STATUS stub (_395e98)
};
constexpr std::array<hal_entry, 5> hal_entries{{
    {"kbusGetBar1P2PDmaInfo", false},
    {"kbusCreateP2PMappingForBar1P2P", false},
    {"kbusRemoveP2PMappingForBar1P2P", false},
    {"kbusHasPcieBar1P2PMapping", true},
    {"kbusIsPcieBar1P2PMappingSupported", true},
}};
constexpr std::string_view status_stub = "395e98";
constexpr std::string_view bif_function = "_kbifInitRegistryOverrides";

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

// Finds the body of _kbifInitRegistryOverrides: the definition is the function name alone on a line (NVIDIA style:
// return type on the line before), then "(" ; the body ends at the first "}" in column 0.
struct region {
  std::size_t first = 0, last = 0;  // line indexes, inclusive
  std::string error;
};

region find_bif_function(std::string_view text, const std::vector<line_ref>& lines) {
  std::vector<std::size_t> defs;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    if (trim(line_text(text, lines[i])) != bif_function) continue;
    std::size_t j = i + 1;
    while (j < lines.size() && trim(line_text(text, lines[j])).empty()) ++j;
    if (j < lines.size() && trim(line_text(text, lines[j])).starts_with("(")) defs.push_back(i);
  }
  region r;
  if (defs.empty()) {
    r.error = fmt::format("definition of {} not found", bif_function);
    return r;
  }
  if (defs.size() > 1) {
    r.error = fmt::format("{} is defined {} times (lines {})", bif_function, defs.size(), lines_list(defs));
    return r;
  }
  r.first = defs[0];
  for (std::size_t i = defs[0] + 1; i < lines.size(); ++i) {
    std::string_view t = line_text(text, lines[i]);
    if (!t.empty() && t.front() == '}') {
      r.last = i;
      return r;
    }
  }
  r.error = fmt::format("end of {} not found", bif_function);
  return r;
}

struct bif_edit_spec {
  std::string_view field;
  std::string original_value;
  std::vector<std::string> applied_values;  // first one is what apply writes
  bool optional = false;                    // pcieP2PType: absent before 575
};

std::string bif_statement(std::string_view field, std::string_view value) {
  return fmt::format("pKernelBif->{} = {};", field, value);
}

edit_report locate_bif_edit(std::string_view text, const std::vector<line_ref>& lines, const region& fn,
                            const bif_edit_spec& spec, bool field_exists) {
  edit_report r;
  r.id = fmt::format("bif.{}", spec.field);
  r.file = std::string(kernel_bif_path);
  r.function = std::string(bif_function);
  r.original = bif_statement(spec.field, spec.original_value);
  r.applied = bif_statement(spec.field, spec.applied_values.front());
  if (!fn.error.empty()) {
    r.detail = fn.error;
    return r;
  }
  std::vector<std::size_t> orig_hits, applied_hits, other_hits;
  const std::string prefix = fmt::format("pKernelBif->{} =", spec.field);
  const std::string from_regkey = bif_statement(spec.field, "data32");
  for (std::size_t i = fn.first; i <= fn.last; ++i) {
    std::string_view t = trim(line_text(text, lines[i]));
    if (!t.starts_with(prefix)) continue;
    if (t == r.original) {
      orig_hits.push_back(i);
    } else if (std::any_of(spec.applied_values.begin(), spec.applied_values.end(),
                           [&](const std::string& v) { return t == bif_statement(spec.field, v); })) {
      applied_hits.push_back(i);
    } else if (t != from_regkey) {
      other_hits.push_back(i);
    }
  }
  const std::size_t total = orig_hits.size() + applied_hits.size();
  if (!field_exists) {
    if (total == 0 && other_hits.empty()) {
      r.state = edit_state::not_applicable;
      r.detail = fmt::format("{} does not exist in this driver version", spec.field);
    } else {
      r.detail = fmt::format("{} is assigned in {} but this version should not have it", spec.field, bif_function);
    }
    return r;
  }
  if (total == 1 && other_hits.empty()) {
    std::size_t i = orig_hits.empty() ? applied_hits[0] : orig_hits[0];
    r.state = orig_hits.empty() ? edit_state::applied : edit_state::original;
    r.line = i + 1;
    r.found = std::string(trim(line_text(text, lines[i])));
    return r;
  }
  if (total == 0 && other_hits.empty()) {
    r.detail = fmt::format("no default assignment of {} in {}", spec.field, bif_function);
  } else if (total == 0) {
    r.detail = fmt::format("unrecognised assignment of {} at line {}: {}", spec.field, lines_list(other_hits),
                           trim(line_text(text, lines[other_hits[0]])));
  } else {
    std::vector<std::size_t> all = orig_hits;
    all.insert(all.end(), applied_hits.begin(), applied_hits.end());
    all.insert(all.end(), other_hits.begin(), other_hits.end());
    std::sort(all.begin(), all.end());
    r.detail = fmt::format("ambiguous: {} default assignments of {} (lines {})", all.size(), spec.field,
                           lines_list(all));
  }
  return r;
}

// The default branch of a halified entry is "// default" / "else" / "{" / assignment / "}".
bool in_else_branch(std::string_view text, const std::vector<line_ref>& lines, std::size_t i) {
  std::size_t seen = 0;
  std::string_view prev[2];
  for (std::size_t j = i; j-- > 0 && seen < 2;) {
    std::string_view t = trim(line_text(text, lines[j]));
    if (t.empty()) continue;
    prev[seen++] = t;
  }
  return seen == 2 && prev[0] == "{" && prev[1] == "else";
}

std::string comment_style_near(std::string_view text, const std::vector<line_ref>& lines, std::size_t i,
                               std::string_view name) {
  const std::string old_style = fmt::format("// Hal function -- {}", name);
  const std::string new_style = fmt::format("// {} -- halified", name);
  for (std::size_t j = i, n = 0; j-- > 0 && n < 16; ++n) {
    std::string_view t = trim(line_text(text, lines[j]));
    if (t == old_style) return "hal-function";
    if (t.starts_with(new_style)) return "halified";
  }
  return "no header comment";
}

edit_report locate_hal_edit(std::string_view text, const std::vector<line_ref>& lines, const hal_entry& e,
                            const tree_facts& facts) {
  edit_report r;
  r.id = fmt::format("hal.{}", e.name);
  r.file = std::string(kern_bus_path);
  r.function = std::string(e.name);
  const std::string prefix = fmt::format("pThis->__{}__ = &{}_", e.name, e.name);
  std::vector<std::string_view> stubs;
  if (!e.bool_stub) {
    stubs.push_back(status_stub);
  } else if (!facts.bool_stub_suffix.empty()) {
    stubs.push_back(facts.bool_stub_suffix);
  } else {
    stubs = {"bf6dfa", "d69453"};
  }
  auto statement = [&](std::string_view suffix) { return fmt::format("{}{};", prefix, suffix); };
  r.applied = statement("GH100");
  r.original = stubs.size() == 1 ? statement(stubs[0]) : std::string();

  std::vector<std::size_t> defaults;
  std::size_t chip_branches = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view t = trim(line_text(text, lines[i]));
    if (!t.starts_with(prefix)) continue;
    if (in_else_branch(text, lines, i)) {
      defaults.push_back(i);
    } else {
      ++chip_branches;
    }
  }
  if (defaults.size() != 1) {
    r.detail = defaults.empty()
                   ? fmt::format("no default (else) branch assigning __{}__", e.name)
                   : fmt::format("ambiguous: {} default branches assign __{}__ (lines {})", defaults.size(), e.name,
                                 lines_list(defaults));
    return r;
  }
  const std::size_t i = defaults[0];
  std::string_view t = trim(line_text(text, lines[i]));
  r.line = i + 1;
  r.found = std::string(t);
  std::string_view suffix = t.substr(prefix.size());
  if (suffix.ends_with(";")) suffix.remove_suffix(1);
  const std::string style = comment_style_near(text, lines, i, e.name);
  if (suffix == "GH100") {
    r.state = edit_state::applied;
    if (r.original.empty()) r.detail = "stub suffix unknown for this version: revert needs the backup";
  } else if (std::find(stubs.begin(), stubs.end(), suffix) != stubs.end()) {
    r.state = edit_state::original;
    r.original = statement(suffix);
  } else {
    r.detail = fmt::format("default points to _{}, expected _{} or _GH100", suffix,
                           fmt::join(stubs, " or _"));
    return r;
  }
  if (chip_branches == 0) {
    r.state = edit_state::unknown;
    r.detail = fmt::format("no chip branch assigns __{}__: layout not recognised", e.name);
    return r;
  }
  if (r.detail.empty()) r.detail = fmt::format("{} layout", style);
  return r;
}

}  // namespace

int driver_version::compare(int maj, int min, int pat) const noexcept {
  if (major != maj) return major < maj ? -1 : 1;
  if (minor != min) return minor < min ? -1 : 1;
  if (patch != pat) return patch < pat ? -1 : 1;
  return 0;
}

std::optional<driver_version> parse_version(std::string_view text) {
  text = trim(text);
  driver_version v;
  int* parts[3] = {&v.major, &v.minor, &v.patch};
  std::size_t n = 0;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  while (p < end && n < 3) {
    auto [next, ec] = std::from_chars(p, end, *parts[n]);
    if (ec != std::errc() || *parts[n] < 0) return std::nullopt;
    ++n;
    p = next;
    if (p == end) break;
    if (*p != '.') return std::nullopt;
    ++p;
    if (p == end) return std::nullopt;
  }
  if (p != end || n < 2 || v.major < 100) return std::nullopt;
  v.text = std::string(text);
  return v;
}

std::optional<driver_version> version_from_version_mk(std::string_view text) {
  for (const auto& l : split_lines(text)) {
    std::string_view t = trim(line_text(text, l));
    if (!t.starts_with("NVIDIA_VERSION")) continue;
    t.remove_prefix(std::string_view("NVIDIA_VERSION").size());
    t = trim(t);
    if (t.starts_with(":=") || t.starts_with("?=")) {
      t.remove_prefix(2);
    } else if (t.starts_with("=")) {
      t.remove_prefix(1);
    } else {
      continue;
    }
    return parse_version(t);
  }
  return std::nullopt;
}

bool version_supported(const driver_version& v) noexcept {
  constexpr int majors[] = {550, 555, 560, 565, 570, 575, 580, 590, 595};
  return std::find(std::begin(majors), std::end(majors), v.major) != std::end(majors);
}

std::string_view to_string(edit_state s) noexcept {
  switch (s) {
    case edit_state::original: return "original";
    case edit_state::applied: return "applied";
    case edit_state::unknown: return "unknown";
    case edit_state::not_applicable: return "n/a";
  }
  return "unknown";
}

tree_facts derive_facts(const tree_texts& texts) {
  tree_facts f;
  if (texts.version_mk) {
    if (auto v = version_from_version_mk(*texts.version_mk)) f.version = *v;
  }
  f.version_supported = f.version.known() && version_supported(f.version);
  const bool known = f.version.known();

  // The registry header is the authority on which enum names exist; the version is the fallback.
  if (texts.registry_header) {
    const std::string_view h = *texts.registry_header;
    f.has_pcie_p2p_type = contains(h, "NV_REG_STR_RM_PCIEP2P_TYPE_BAR1");
    f.has_atomics_field = contains(h, "NV_REG_STR_CL_FORCE_P2P_ATOMICS");
    if (contains(h, "NV_REG_STR_RM_FORCE_P2P_TYPE_PCIEP2P")) {
      f.force_p2p_type_value = "NV_REG_STR_RM_FORCE_P2P_TYPE_PCIEP2P";
    } else if (contains(h, "NV_REG_STR_RM_FORCE_P2P_TYPE_BAR1P2P")) {
      f.force_p2p_type_value = "NV_REG_STR_RM_FORCE_P2P_TYPE_BAR1P2P";
    }
  } else if (known) {
    f.has_pcie_p2p_type = f.version.compare(575, 51, 2) >= 0;
    f.has_atomics_field = f.version.compare(565, 57, 1) >= 0;
  } else if (texts.kernel_bif) {
    f.has_pcie_p2p_type = contains(*texts.kernel_bif, "pKernelBif->pcieP2PType =");
    f.has_atomics_field = true;
  }
  if (f.force_p2p_type_value.empty()) {
    f.force_p2p_type_value = f.has_pcie_p2p_type ? "NV_REG_STR_RM_FORCE_P2P_TYPE_PCIEP2P"
                                                 : "NV_REG_STR_RM_FORCE_P2P_TYPE_BAR1P2P";
  }
  if (known) {
    f.bool_stub_suffix = f.version.compare(565, 57, 1) >= 0 ? "d69453" : "bf6dfa";
  } else if (texts.kern_bus) {
    const bool has_new = contains(*texts.kern_bus, "kbusHasPcieBar1P2PMapping_d69453;");
    const bool has_old = contains(*texts.kern_bus, "kbusHasPcieBar1P2PMapping_bf6dfa;");
    if (has_new != has_old) f.bool_stub_suffix = has_new ? "d69453" : "bf6dfa";
  }
  f.hal_comment_style = "unknown";
  if (texts.kern_bus) {
    if (contains(*texts.kern_bus, "// Hal function -- kbus")) {
      f.hal_comment_style = "hal-function";
    } else if (contains(*texts.kern_bus, " -- halified (")) {
      f.hal_comment_style = "halified";
    }
  }

  if (!f.has_pcie_p2p_type) {
    f.notes.push_back(
        "this driver has no pcieP2PType and numbers RMForceP2PType differently (before 575: 1 = mailbox, "
        "2 = BAR1P2P; from 575: 1 = PCIEP2P, 2 = NVLINK); forceP2PType is set to "
        "NV_REG_STR_RM_FORCE_P2P_TYPE_BAR1P2P and the pcieP2PType edit does not apply");
  }
  if (!f.has_atomics_field) {
    f.notes.push_back("ForceP2P has no atomics field before 565: 0x11 is written whatever --atomics says");
  }
  return f;
}

std::vector<edit_report> locate_edits(const tree_texts& texts, const tree_facts& facts, const patch_options& opts) {
  std::vector<edit_report> out;
  if (opts.only != edit_group::hal) {
    const std::string_view text = texts.kernel_bif ? std::string_view(*texts.kernel_bif) : std::string_view();
    const auto lines = split_lines(text);
    region fn = texts.kernel_bif ? find_bif_function(text, lines) : region{0, 0, "file is missing"};
    const std::string p2p = !facts.has_atomics_field || opts.atomics == atomics_mode::off ? "0x11" : "0x211";
    const std::string other_p2p = p2p == "0x11" ? "0x211" : "0x11";
    std::vector<bif_edit_spec> specs{
        {"p2pOverride", "BIF_P2P_NOT_OVERRIDEN", {p2p, other_p2p}},
        {"forceP2PType", "NV_REG_STR_RM_FORCE_P2P_TYPE_DEFAULT", {facts.force_p2p_type_value}},
        {"pcieP2PType", "NV_REG_STR_RM_PCIEP2P_TYPE_DEFAULT", {"NV_REG_STR_RM_PCIEP2P_TYPE_BAR1"}, true},
    };
    for (const auto& s : specs) {
      out.push_back(locate_bif_edit(text, lines, fn, s, !s.optional || facts.has_pcie_p2p_type));
    }
  }
  if (opts.only != edit_group::bif) {
    const std::string_view text = texts.kern_bus ? std::string_view(*texts.kern_bus) : std::string_view();
    const auto lines = split_lines(text);
    for (const auto& e : hal_entries) {
      edit_report r = locate_hal_edit(text, lines, e, facts);
      if (!texts.kern_bus) r.detail = "file is missing";
      out.push_back(std::move(r));
    }
  }
  return out;
}

rewrite_result rewrite(std::string_view text, std::string_view file, const std::vector<edit_report>& edits,
                       bool forward) {
  rewrite_result res;
  const auto lines = split_lines(text);
  std::vector<std::pair<std::size_t, const edit_report*>> todo;
  for (const auto& e : edits) {
    if (e.file != file || e.line == 0 || e.line > lines.size()) continue;
    if (e.state != edit_state::original && e.state != edit_state::applied) continue;
    const std::string& want = forward ? e.applied : e.original;
    if (want.empty() || e.found == want) continue;
    todo.emplace_back(e.line - 1, &e);
  }
  std::sort(todo.begin(), todo.end());
  std::size_t copied = 0;
  for (const auto& [idx, e] : todo) {
    // Replace only the statement: indentation and line ending stay byte-identical.
    const std::string_view l = line_text(text, lines[idx]);
    const std::size_t at = l.find(e->found);
    if (at == std::string_view::npos) continue;
    const std::size_t abs = lines[idx].begin + at;
    res.text.append(text.substr(copied, abs - copied));
    res.text.append(forward ? e->applied : e->original);
    copied = abs + e->found.size();
    ++res.changed_lines;
  }
  res.text.append(text.substr(copied));
  return res;
}

}  // namespace gdskit::patch
