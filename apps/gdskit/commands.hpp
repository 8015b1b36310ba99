// Subcommands of the gdskit CLI. Each add_*_command registers its flags and a callback that calls into the
// library; no logic lives only in the CLI.
#pragma once

#include <CLI/CLI.hpp>

namespace gdskit::cli {

/// Exit code a subcommand callback wants; main returns it.
int& exit_code();

void add_version_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_doctor_command(CLI::App& app);
void add_patch_command(CLI::App& app);
void add_setup_command(CLI::App& app);
void add_load_command(CLI::App& app);
void add_tune_command(CLI::App& app);

}  // namespace gdskit::cli
