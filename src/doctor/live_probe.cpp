// The live cuFile proof. Until it drives the shims, it reports that it did not run, and the verdict
// rests on the static layers (which never claim more than they can see).
#include "doctor/probe.hpp"

namespace gdskit::doctor {

probe_results run_live_probe(const probe_options& options) {
  probe_results r;
  r.file = (options.dir / ".gdskit-doctor-probe").string();
  r.skipped_reason = "live probe not implemented in this build";
  return r;
}

}  // namespace gdskit::doctor
