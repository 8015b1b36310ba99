// libFuzzer target: cufile.json as the doctor reads it from a captured root. Any bytes must give a
// userspace.cufile_json check (never a crash, a hang or a stack overflow on deep nesting), and the text report
// made of it must hold no control bytes but its own newlines.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "doctor/checks.hpp"
#include "doctor/doctor.hpp"

namespace gd = gdskit::doctor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  gd::facts f;
  gd::check c = gd::judge_cufile_json(text, "etc/cufile.json", f);
  if (c.id != "userspace.cufile_json" || c.summary.empty()) std::abort();
  if (!f.cufile_json_read && c.state != gd::status::warn) std::abort();
  gd::report r;
  r.root = "ROOT";
  r.path = "/";
  gd::layer l{"userspace", "User space (cuFile)", {}};
  l.checks.push_back(std::move(c));
  r.layers.push_back(std::move(l));
  r.result = gd::decide(r.layers, std::nullopt);
  const std::string out = gd::render_text(r, false);
  for (unsigned char ch : out)
    if ((ch < 0x20 && ch != '\n') || ch == 0x7f) std::abort();
  (void)gd::render_json(r);
  return 0;
}
