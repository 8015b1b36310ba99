#include <fmt/format.h>

#include "commands.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/version.hpp"
#include "shim/cufile.hpp"

namespace gdskit::cli {

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print gdskit's version and what this process can use (io_uring, GPU, cuFile)");
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
  });
}

}  // namespace gdskit::cli
