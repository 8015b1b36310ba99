#include <fmt/format.h>

#include "commands.hpp"

namespace gdskit::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "(not built yet)");
  cmd->callback([] { exit_code() = 2; });
}

}  // namespace gdskit::cli
