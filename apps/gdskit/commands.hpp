// Subcommands of the gdskit CLI. Each add_*_command registers its flags and a callback that calls into the
// library; no logic lives only in the CLI.
#pragma once

#include <CLI/CLI.hpp>

namespace gdskit::cli {

/// The exit codes of every subcommand (printed at the end of each --help, documented in docs/cli.md).
enum exit_status : int {
  exit_ok = 0,          ///< done; the check or verification passed
  exit_said_no = 1,     ///< the check or verification ran and said no (mismatch, not ready, refused)
  exit_usage = 2,       ///< bad flags or bad input: unknown flag, bad setting, missing input file; nothing ran
  exit_run_failed = 3,  ///< an I/O or device failure during the run
};

/// The exit-code table, as the footer of every --help.
const char* exit_code_footer();

/// The exit code for an error that ended a subcommand: bad input (a missing or unreadable file, a bad setting, a
/// malformed file) is exit_usage, anything else exit_run_failed.
int exit_code_for(const std::exception& e);

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
