#include <fmt/format.h>

#include "commands.hpp"
#include "gdskit/file.hpp"
#include "gdskit/version.hpp"

namespace gdskit::cli {

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print gdskit's version and how it was built");
  cmd->callback([] {
    fmt::print("gdskit {}\n", GDSKIT_VERSION_STRING);
    const auto& uring = io_uring_unavailable_reason();
    fmt::print("io_uring: {}\n", uring.empty() ? "available" : uring);
  });
}

}  // namespace gdskit::cli
