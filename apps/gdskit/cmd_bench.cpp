// `gdskit bench`: every argument goes to the bench part (src/bench), which parses gdsio's flags itself so that
// the same parser is unit-tested.
#include <iostream>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "commands.hpp"

namespace gdskit::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "gdsio-compatible benchmark that reports the path that actually ran (gdskit bench -h for flags)");
  // gdsio's single-letter flags (-x 0, -I 1, -V, ...) are parsed by the bench part, help included.
  cmd->set_help_flag();
  cmd->prefix_command();
  cmd->allow_extras();
  cmd->fallthrough(false);
  cmd->callback([cmd] {
    std::vector<std::string> args = cmd->remaining();
    exit_code() = gdskit::bench::run_command(args, std::cout, std::cerr);
  });
}

}  // namespace gdskit::cli
