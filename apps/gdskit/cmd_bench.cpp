// `gdskit bench`: gdsio's flags and gdskit's on the CLI's parser (registered by the bench part, which also
// unit-tests them), then the bench part runs and reports.
#include <iostream>

#include "bench/bench.hpp"
#include "bench/kv_bench.hpp"
#include "commands.hpp"

namespace gdskit::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "gdsio-compatible benchmark that reports the path that actually ran");
  auto make_request = gdskit::bench::add_flags(*cmd);
  auto* kv = cmd->add_subcommand("kv", "the KV-cache block store against the raw device and a file per block");
  auto make_kv = gdskit::bench::add_kv_flags(*kv);
  kv->footer(exit_code_footer());
  kv->callback([make_kv] { exit_code() = gdskit::bench::run_kv(make_kv, std::cout, std::cerr); });
  cmd->callback([make_request, kv] {
    if (kv->parsed()) return;
    exit_code() = gdskit::bench::run_command(make_request, std::cout, std::cerr);
  });
}

}  // namespace gdskit::cli
