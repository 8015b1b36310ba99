#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "commands.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/settings.hpp"
#include "gdskit/version.hpp"
#include "shim/cufile.hpp"

namespace gdskit::cli {

namespace {

// Every setting with its value and where it came from (docs/settings.md), one line each.
void print_settings() {
  const auto all = describe_settings();
  std::size_t width = 0;
  for (const auto& e : all) width = std::max(width, e.name.size());
  fmt::print("settings (value, source; code > environment > device profile > default):\n");
  for (const auto& e : all) {
    std::string where(to_string(e.source));
    if (e.source == setting_source::environment) where += " (" + e.variable + ")";
    if (!e.note.empty()) where += "; " + e.note;
    fmt::print("  {:<{}}  {:<8}  {}\n", e.name, width, e.value, where);
  }
}

}  // namespace

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print gdskit's version and what this process can use (io_uring, GPU, cuFile)");
  static bool show_settings = false;
  cmd->add_flag("--settings", show_settings,
                "Also print every setting, its value and where it came from (environment GDSKIT_* or default)");
  cmd->callback([] {
    fmt::print("gdskit {}\n", GDSKIT_VERSION_STRING);
    const auto& uring = io_uring_unavailable_reason();
    fmt::print("io_uring: {}\n", uring.empty() ? "yes" : "no (" + uring + ")");
    std::string reason;
    if (gpu_available(&reason)) {
      fmt::print("gpu: yes ({} device{})\n", gpu_count(), gpu_count() == 1 ? "" : "s");
    } else {
      fmt::print("gpu: no ({})\n", reason);
    }
    if (shim::cufile(&reason) != nullptr) {
      int v = shim::cufile_version();
      fmt::print("cufile: yes (version {}.{})\n", v / 1000, (v % 1000) / 10);
    } else {
      fmt::print("cufile: no ({})\n", reason);
    }
    if (show_settings) print_settings();
  });
}

}  // namespace gdskit::cli
