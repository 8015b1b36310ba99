// The doctor's findings: layers of checks, each with a status, its evidence and a fix, and the verdict.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "doctor/probe.hpp"
#include "doctor/system_root.hpp"

namespace gdskit::doctor {

/// ok: this requirement of true GDS is met. warn: met, but something limits or may break it.
/// fail: true GDS cannot work while this stands. unknown: the evidence could not be read.
enum class status { ok, warn, fail, unknown };
std::string_view to_string(status s) noexcept;

/// What the failure of a check costs: `direct` blocks only the direct (P2P DMA) path, so cuFile can still
/// run in compat mode; `cufile` makes cuFile itself unusable.
enum class impact { none, direct, cufile };

/// One check: a stable id ("kernel.nvidia_fs"), what it found, where it read it and what to do.
struct check {
  std::string id;
  std::string title;
  status state = status::unknown;
  impact blocks = impact::none;  // what a `fail` costs
  std::string summary;           // one line: what was found
  std::vector<source_ref> evidence;
  std::string fix;  // empty when nothing is to be done
};

/// A layer of the stack, checked bottom-up in this order: gpu, kernel, userspace, storage, logs, probe.
struct layer {
  std::string id;     // "gpu", "kernel", "userspace", "storage", "logs", "probe"
  std::string title;  // "GPU and driver"
  std::vector<check> checks;
  /// The worst status among its checks (fail > unknown > warn > ok); ok for an empty layer.
  status state() const;
};

/// true_gds: every requirement on the route is met. not_proven: nothing fails, but a requirement could not be
/// read or the evidence contradicts itself (the report says what would prove it). compat_only: cuFile runs,
/// through host memory. unusable: cuFile cannot run here.
enum class verdict_kind { true_gds, not_proven, compat_only, unusable };
std::string_view to_string(verdict_kind v) noexcept;

struct verdict {
  verdict_kind kind = verdict_kind::unusable;
  /// One line: "true GDS (P2P DMA) works", "cuFile works only in compat mode: first failing layer kernel
  /// (nvidia-fs not loaded)", "GDS not proven: layer kernel (...); to prove it: ...", ...
  std::string line;
  std::string first_failing_layer;  // empty for true GDS; for not_proven, the first layer not proven
  /// The failed checks, bottom layer first, as "kernel.nvidia_fs: nvidia-fs not loaded".
  std::vector<std::string> reasons;
  /// true when a live probe confirmed the verdict; false when it rests on static checks only.
  bool proven = false;
  /// 0 true GDS, 1 not GDS.
  int exit_code() const noexcept { return kind == verdict_kind::true_gds ? 0 : 1; }
};

struct report {
  std::string root;       // "/" or the capture folder
  std::string path;       // the storage path examined
  std::vector<layer> layers;
  std::optional<probe_results> probe;
  verdict result;
  /// Programs the live checks would have run but found in none of the system folders (PATH is not searched):
  /// the evidence they give is missing, and the checks that need it say so.
  std::vector<system_root::missing_program> programs_not_found;
};

/// Applies the verdict rules: static layers decide what is possible; a probe, when present, decides what
/// actually happened and overrides an optimistic static verdict (never the other way around for compat).
verdict decide(const std::vector<layer>& layers, const std::optional<probe_results>& probe);

}  // namespace gdskit::doctor
