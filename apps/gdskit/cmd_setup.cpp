#include <fmt/format.h>

#include "commands.hpp"

namespace gdskit::cli {

void add_setup_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("setup", "(not built yet)");
  cmd->callback([] {
    fmt::print(stderr, "gdskit setup: not available in this build\n");
    exit_code() = 2;
  });
}

}  // namespace gdskit::cli
