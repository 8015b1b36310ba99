// Renderings of a tree report for people (text) and programs (JSON).
#pragma once

#include <string>
#include <string_view>

#include "patch/patch.hpp"

namespace gdskit::patch {

/// Human-readable report: version, layout, one line per edit, files written, refusal.
std::string render_text(const tree_report& r, std::string_view operation);
/// The report as a JSON document (schema in docs/patch.md).
std::string render_json(const tree_report& r);
/// "original", "applied", "partial" or "unknown" for the edits of the report.
std::string_view overall_state(const tree_report& r);

}  // namespace gdskit::patch
