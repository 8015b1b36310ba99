#include "doctor/doctor.hpp"

#include "doctor/checks.hpp"

namespace gdskit::doctor {

std::string default_path(system_root& root) {
  if (root.live()) {
    std::error_code ec;
    auto cwd = std::filesystem::current_path(ec);
    return ec ? std::string("/") : cwd.string();
  }
  auto r = root.command("doctor-path");
  if (r.ok()) {
    std::string p = trim(*r.text);
    if (!p.empty() && p[0] == '/') return p;
  }
  return "/";
}

report diagnose(system_root& root, const std::string& path, std::optional<probe_results> probe) {
  report r;
  r.root = root.root().string();
  r.path = path;
  root.record("commands/doctor-path.txt", path + "\n");
  r.layers = run_checks(root, path);
  if (probe) {
    layer pl{"probe", "Live proof (cuFile)", {}};
    check c{"probe.run", "Live probe", status::unknown, impact::none, "", {}, ""};
    if (!probe->ran) {
      c.summary = "not run: " + probe->skipped_reason;
    } else {
      c.state = status::ok;
      c.summary = "ran on " + probe->file;
    }
    pl.checks.push_back(std::move(c));
    auto step = [&](const char* id, const char* title, const probe_step& s, impact blocks) {
      if (!s.attempted) return;
      check k{id, title, s.succeeded() ? status::ok : status::fail, blocks,
              s.succeeded() ? std::string("ok") : s.message + " (" + std::to_string(s.code) + ")", {}, ""};
      pl.checks.push_back(std::move(k));
    };
    step("probe.driver_open", "cuFileDriverOpen (default config)", probe->driver_open_default, impact::cufile);
    step("probe.handle_register", "cuFileHandleRegister", probe->handle_register, impact::cufile);
    step("probe.buf_register", "cuFileBufRegister", probe->buf_register, impact::cufile);
    step("probe.default_read", "read (default config)", probe->default_read, impact::cufile);
    step("probe.strict_open", "cuFileDriverOpen (allow_compat_mode=false)", probe->driver_open_strict, impact::direct);
    step("probe.strict_read", "read (allow_compat_mode=false)", probe->strict_read, impact::direct);
    if (probe->ran) r.layers.push_back(std::move(pl));
    r.probe = std::move(probe);
  }
  r.result = decide(r.layers, r.probe);
  return r;
}

}  // namespace gdskit::doctor
