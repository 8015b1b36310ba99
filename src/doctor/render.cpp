// Text and JSON renderings of a doctor report. JSON keys are part of the interface: add, never rename.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/json_text.hpp"
#include "tools/shell_text.hpp"

#include "doctor/doctor.hpp"

namespace gdskit::doctor {
namespace {

using json = nlohmann::json;

std::string_view to_string(impact i) {
  switch (i) {
    case impact::none: return "none";
    case impact::direct: return "direct_path";
    case impact::cufile: return "cufile";
  }
  return "none";
}

const char* colour_of(status s) {
  switch (s) {
    case status::ok: return "\x1b[32m";
    case status::warn: return "\x1b[33m";
    case status::fail: return "\x1b[31m";
    case status::unknown: return "\x1b[35m";
  }
  return "";
}

std::string tag(status s, bool colour) {
  std::string t = fmt::format("{:<9}", fmt::format("[{}]", to_string(s)));
  if (!colour) return t;
  return std::string(colour_of(s)) + t + "\x1b[0m";
}

json step_json(const probe_step& s) {
  return {{"attempted", s.attempted}, {"code", s.code}, {"message", s.message}, {"ok", s.succeeded()}};
}

json counts_json(const std::optional<io_path_counts>& c) {
  if (!c) return nullptr;
  const auto& d = *c;
  return {{"reads", d.reads},   {"p2p_reads", d.p2p_reads},   {"nvfs_reads", d.nvfs_reads},   {"posix_reads", d.posix_reads},
          {"writes", d.writes}, {"p2p_writes", d.p2p_writes}, {"nvfs_writes", d.nvfs_writes}, {"posix_writes", d.posix_writes}};
}

}  // namespace

namespace {

// The failed checks that mean no NVIDIA GPU can be used at all (no driver, or none known to it).
std::vector<const check*> no_gpu_checks(const report& r) {
  std::vector<const check*> out;
  if (r.probe && r.probe->ran) return out;
  for (const auto& l : r.layers)
    if (l.id == "gpu")
      for (const auto& c : l.checks)
        if ((c.id == "gpu.driver" || c.id == "gpu.devices") && c.state == status::fail) out.push_back(&c);
  return out;
}

// "programs not found: nvidia-smi (searched ...); ..." or "" when every program was found.
std::string programs_line(const report& r) {
  if (r.programs_not_found.empty()) return {};
  std::string out = "programs not found (PATH is not searched): ";
  for (std::size_t i = 0; i < r.programs_not_found.size(); ++i) {
    const auto& m = r.programs_not_found[i];
    out += fmt::format("{}{} (searched {})", i ? "; " : "", printable(m.name), printable(m.searched));
  }
  return out + "\n";
}

}  // namespace

std::string render_text(const report& r, bool colour, bool all_layers) {
  // Every string below can hold bytes of a captured file or a path: escaped, so a hostile root cannot send
  // escape sequences or bell characters to the terminal (the only escapes written are our colours).
  const auto& safe = printable;
  std::string out;
  if (const auto missing = no_gpu_checks(r); !all_layers && !missing.empty()) {
    const char* red = colour ? "\x1b[1;31m" : "";
    const char* off = colour ? "\x1b[0m" : "";
    out += fmt::format("{}No usable NVIDIA GPU here: GPUDirect Storage (and cuFile) cannot work.{}\n", red, off);
    for (const check* c : missing) {
      out += fmt::format("  {}: {}\n", safe(c->id), safe(c->summary));
      if (!c->fix.empty()) out += fmt::format("    fix: {}\n", safe(c->fix));
    }
    std::size_t others = 0;
    for (const auto& l : r.layers) others += l.id != "gpu";
    out += "gdskit still reads and writes files here, through host memory.\n";
    // What that I/O starts from on this device (live systems only).
    for (const auto& l : r.layers)
      for (const auto& c : l.checks)
        if (c.id == "storage.profile") out += fmt::format("  {}: {}\n", safe(c.id), safe(c.summary));
    out += fmt::format("root {}  path {}; `gdskit doctor --all` shows the {} other layers\n", safe(r.root), safe(r.path),
                       others);
    if (r.probe) out += fmt::format("live probe: not run ({})\n", safe(r.probe->skipped_reason));
    out += programs_line(r);
    return out;
  }
  const char* bold = colour ? "\x1b[1m" : "";
  const char* reset = colour ? "\x1b[0m" : "";
  const char* vcol = !colour ? ""
                     : r.result.kind == verdict_kind::true_gds ? "\x1b[1;32m"
                     : r.result.kind == verdict_kind::compat_only || r.result.kind == verdict_kind::not_proven
                         ? "\x1b[1;33m"
                                                                   : "\x1b[1;31m";
  out += fmt::format("{}{}{}\n", vcol, safe(r.result.line), reset);
  out += fmt::format("root {}  path {}\n", safe(r.root), safe(r.path));
  if (!r.result.reasons.empty()) {
    out += "why not GDS:\n";
    for (const auto& why : r.result.reasons) out += "  - " + safe(why) + "\n";
  }
  for (const auto& l : r.layers) {
    out += fmt::format("\n{} {}{}{}\n", tag(l.state(), colour), bold, safe(l.title), reset);
    for (const auto& c : l.checks) {
      out += fmt::format("  {} {:<24} {}\n", tag(c.state, colour), safe(c.id), safe(c.summary));
      for (const auto& e : c.evidence) {
        if (e.line > 0) out += fmt::format("          evidence: {}:{}: {}\n", safe(e.file), e.line, safe(e.text));
        else out += fmt::format("          evidence: {}: {}\n", safe(e.file), safe(e.text));
      }
      if (!c.fix.empty() && c.state != status::ok)
        out += fmt::format("          {}: {}\n", c.state == status::unknown ? "to prove" : "fix", safe(c.fix));
    }
  }
  if (r.probe && !r.probe->ran) out += fmt::format("\nlive probe: not run ({})\n", safe(r.probe->skipped_reason));
  if (!r.programs_not_found.empty()) out += "\n" + programs_line(r);
  return out;
}

std::string render_json(const report& r) {
  json layers = json::array();
  for (const auto& l : r.layers) {
    json checks = json::array();
    for (const auto& c : l.checks) {
      json ev = json::array();
      for (const auto& e : c.evidence) ev.push_back({{"file", e.file}, {"line", e.line}, {"text", e.text}});
      checks.push_back({{"id", c.id},
                        {"title", c.title},
                        {"status", to_string(c.state)},
                        {"blocks", to_string(c.blocks)},
                        {"summary", c.summary},
                        {"evidence", ev},
                        {"fix", c.fix}});
    }
    layers.push_back({{"id", l.id}, {"title", l.title}, {"status", to_string(l.state())}, {"checks", checks}});
  }
  json probe = nullptr;
  if (r.probe) {
    const auto& p = *r.probe;
    json stats = counts_json(p.cufile_stats_delta);
    json sweep = json::array();
    for (const auto& s : p.sweep)
      sweep.push_back({{"queue_depth", s.queue_depth}, {"io_size_bytes", s.io_size_bytes}, {"gib_per_s", s.gib_per_s}});
    probe = {{"ran", p.ran},
             {"skipped_reason", p.skipped_reason},
             {"file", p.file},
             {"cuda_init", step_json(p.cuda_init)},
             {"driver_open_default", step_json(p.driver_open_default)},
             {"driver_open_strict", step_json(p.driver_open_strict)},
             {"handle_register", step_json(p.handle_register)},
             {"buf_register", step_json(p.buf_register)},
             {"strict_write", step_json(p.strict_write)},
             {"strict_read", step_json(p.strict_read)},
             {"default_write", step_json(p.default_write)},
             {"default_read", step_json(p.default_read)},
             {"data_verified", p.data_verified},
             {"cufile_stats_delta", stats},
             {"nvfs_reads_delta", p.nvfs_reads_delta ? json(*p.nvfs_reads_delta) : json(nullptr)},
             {"nvfs_bar1_map_delta", p.nvfs_bar1_map_delta ? json(*p.nvfs_bar1_map_delta) : json(nullptr)},
             {"new_dmesg_lines", p.new_dmesg_lines},
             {"sweep", sweep},
             {"strict_stats_delta", counts_json(p.strict_stats_delta)},
             {"file_device", p.file_device},
             {"o_direct", p.o_direct},
             {"strict_config", p.strict_config},
             {"cufile_log_lines", p.cufile_log_lines},
             {"notes", p.notes}};
  }
  json missing = json::array();
  for (const auto& m : r.programs_not_found) missing.push_back({{"name", m.name}, {"searched", m.searched}});
  json j = {{"schema", "gdskit.doctor/1"},
            {"verdict",
             {{"kind", to_string(r.result.kind)},
              {"line", r.result.line},
              {"exit_code", r.result.exit_code()},
              {"first_failing_layer", r.result.first_failing_layer},
              {"reasons", r.result.reasons},
              {"proven", r.result.proven}}},
            {"root", r.root},
            {"path", r.path},
            {"layers", layers},
            {"probe", probe},
            {"programs_not_found", missing}};
  return json_text(j) + "\n";
}

}  // namespace gdskit::doctor
