#include <fmt/format.h>

#include "commands.hpp"

namespace gdskit::cli {

void add_doctor_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("doctor", "(not built yet)");
  cmd->callback([] {
    fmt::print(stderr, "gdskit doctor: not available in this build\n");
    exit_code() = 2;
  });
}

}  // namespace gdskit::cli
