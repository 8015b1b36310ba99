// Verdict rules. Static layers say what is possible; a probe that ran says what happened. The doctor
// never calls GDS working on capability alone when a probe says otherwise.
#include <fmt/format.h>

#include "doctor/report.hpp"

namespace gdskit::doctor {
namespace {

struct hit {
  const layer* l = nullptr;
  const check* c = nullptr;
  explicit operator bool() const { return c != nullptr; }
};

std::string describe(const hit& h) { return fmt::format("{} ({})", h.l->id, h.c->summary); }

}  // namespace

verdict decide(const std::vector<layer>& layers, const std::optional<probe_results>& probe) {
  verdict v;
  hit first_fail, cufile_block, direct_block, unknown_block;
  for (const auto& l : layers) {
    for (const auto& c : l.checks) {
      if (c.state == status::fail) {
        v.reasons.push_back(fmt::format("{}: {}", c.id, c.summary));
        if (!first_fail) first_fail = {&l, &c};
        if (c.blocks == impact::cufile && !cufile_block) cufile_block = {&l, &c};
        if (c.blocks != impact::none && !direct_block) direct_block = {&l, &c};
      } else if (c.state == status::unknown && c.blocks != impact::none && !unknown_block) {
        unknown_block = {&l, &c};
      }
    }
  }
  if (first_fail) v.first_failing_layer = first_fail.l->id;

  if (probe && probe->ran) {
    v.proven = true;
    const bool opened = probe->driver_open_default.succeeded();
    const bool registered = probe->handle_register.succeeded() && probe->buf_register.succeeded();
    const bool io_ok = probe->default_read.succeeded();
    if (!opened || !registered || !io_ok || !probe->data_verified) {
      v.kind = verdict_kind::unusable;
      const probe_step& s = !opened ? probe->driver_open_default : !registered ? (probe->handle_register.succeeded() ? probe->buf_register : probe->handle_register) : probe->default_read;
      std::string why = io_ok && opened && registered ? std::string("probe: data read back differs from data written")
                                                      : fmt::format("probe: {} ({})", s.message, s.code);
      v.reasons.push_back(why);
      if (v.first_failing_layer.empty()) v.first_failing_layer = "probe";
      v.line = fmt::format("cuFile unusable: {}; first failing layer {}", why,
                           first_fail ? describe(first_fail) : std::string("probe"));
      return v;
    }
    const auto& d = probe->cufile_stats_delta;
    const bool direct_counts = d && (d->p2p_reads + d->nvfs_reads) > 0 && d->posix_reads == 0;
    const bool nvfs_counts = probe->nvfs_reads_delta.value_or(0) > 0;
    if (probe->strict_read.succeeded() && (direct_counts || nvfs_counts)) {
      v.kind = verdict_kind::true_gds;
      v.line = "true GDS (P2P DMA) works (proven: strict-mode IO succeeded and the direct-path counters moved)";
      return v;
    }
    v.kind = verdict_kind::compat_only;
    std::string why = !probe->strict_read.succeeded()
                          ? fmt::format("strict mode (allow_compat_mode=false) failed: {} ({})",
                                        probe->strict_read.attempted ? probe->strict_read.message : probe->driver_open_strict.message,
                                        probe->strict_read.attempted ? probe->strict_read.code : probe->driver_open_strict.code)
                          : std::string("cuFile counted the reads as POSIX");
    v.reasons.push_back("probe: " + why);
    if (v.first_failing_layer.empty()) v.first_failing_layer = "probe";
    v.line = fmt::format("cuFile works only in compat mode: first failing layer {}; probe: {}",
                         first_fail ? describe(first_fail) : std::string("probe"), why);
    return v;
  }

  if (cufile_block) {
    v.kind = verdict_kind::unusable;
    v.line = fmt::format("cuFile unusable: first failing layer {}", describe(first_fail));
    if (cufile_block.c != first_fail.c) v.line += fmt::format("; cuFile blocked by {}", describe(cufile_block));
  } else if (direct_block) {
    v.kind = verdict_kind::compat_only;
    v.line = fmt::format("cuFile works only in compat mode: first failing layer {}", describe(direct_block));
  } else if (unknown_block) {
    // Nothing fails, but a requirement is unread or contradicted: "GDS works" would be a guess.
    v.kind = verdict_kind::not_proven;
    v.first_failing_layer = unknown_block.l->id;
    for (const auto& l : layers)
      for (const auto& c : l.checks)
        if (c.state == status::unknown && c.blocks != impact::none)
          v.reasons.push_back(fmt::format("{}: not proven: {}", c.id, c.summary));
    v.line = fmt::format("GDS not proven: layer {} ({})", unknown_block.l->id, unknown_block.c->summary);
    if (!unknown_block.c->fix.empty()) v.line += "; to prove it: " + unknown_block.c->fix;
  } else {
    v.kind = verdict_kind::true_gds;
    v.line = "true GDS (P2P DMA) works (static checks; not proven by a live probe)";
  }
  return v;
}

}  // namespace gdskit::doctor
