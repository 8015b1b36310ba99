#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "tools/flag_errors.hpp"
#include "tools/signal_cleanup.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/error.hpp"
#include "gdskit/version.hpp"
#include "shim/cufile.hpp"

namespace gdskit::cli {

int& exit_code() {
  static int code = 0;
  return code;
}

const char* exit_code_footer() {
  return "Exit codes: 0 ok; 1 the check or verification said no; 2 usage or bad input (bad flag or setting,\n"
         "missing input file; nothing ran); 3 I/O or device failure during the run. 130/143: interrupted.";
}

int exit_code_for(const std::exception& e) {
  const auto* se = dynamic_cast<const std::system_error*>(&e);
  if (se == nullptr || se->code().category() != std::generic_category()) return exit_run_failed;
  switch (se->code().value()) {
    case ENOENT: case ENOTDIR: case EISDIR: case EEXIST: case EACCES: case EPERM: case ENAMETOOLONG: case ELOOP:
    case EINVAL: case EBADMSG:
    // No usable GPU, or no such GPU, for a GPU run: refused before any I/O, as verify and bench refuse it.
    case ENODEV:
      return exit_usage;
    default:
      return exit_run_failed;
  }
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate nearest to `word`, or empty when none is close enough to be what was meant.
std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : app.get_options()) {
    for (const auto& n : opt->get_lnames()) out.push_back("--" + n);
    for (const auto& n : opt->get_snames()) out.push_back("-" + n);
  }
  return out;
}

// "gdskit: unknown command 'docter'; did you mean 'doctor'?" for the first word that is not a subcommand where one
// is required: at the top, and below commands that only group others ("gdskit patch chek").
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* where = &app;
  std::string who = "gdskit";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.starts_with("-")) continue;  // the flags of commands that group others take no value
    std::vector<std::string> names;
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : where->get_subcommands({})) {
      names.push_back(sub->get_name());
      if (sub->get_name() == a) next = sub;
    }
    if (next != nullptr) {
      if (next->get_require_subcommand_min() == 0) return false;  // its words are its own
      where = next;
      who += " " + next->get_name();
      continue;
    }
    const std::string near = closest(a, names);
    fmt::print(stderr, "{}: unknown command '{}'{}\n", who, printable(a),
               near.empty() ? fmt::format(" ({} --help lists them)", who) : fmt::format("; did you mean '{}'?", near));
    return true;
  }
  return false;
}

// "gdskit patch check": the command's name with those of the commands above it.
std::string full_name(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* up = app.get_parent(); up != nullptr; up = up->get_parent()) name = up->get_name() + " " + name;
  return name;
}

// The innermost subcommand the command line reached.
CLI::App& innermost(CLI::App& app) {
  CLI::App* where = &app;
  for (auto subs = app.get_subcommands(); !subs.empty(); subs = where->get_subcommands()) where = subs.back();
  return *where;
}

// After CLI11 found arguments nobody takes: name the first and the flag nearest to it.
void unknown_argument(CLI::App& app) {
  CLI::App* where = &innermost(app);
  std::vector<std::string> left = app.remaining(true);
  if (left.empty()) return;
  std::string arg = left.front();
  const std::string who = full_name(*where);
  if (!arg.starts_with("-")) {
    fmt::print(stderr, "{}: unexpected argument '{}' ({} --help lists what it takes)\n", who, printable(arg), who);
    return;
  }
  if (auto eq = arg.find('='); eq != std::string::npos) arg.resize(eq);
  const std::string near = closest(arg, flag_names(*where));
  fmt::print(stderr, "{}: unknown flag '{}'{}\n", who, printable(arg),
             near.empty() ? fmt::format(" ({} --help lists the flags)", who) : fmt::format("; did you mean '{}'?", near));
}

}  // namespace
}  // namespace gdskit::cli

int main(int argc, char** argv) {
  // A write past `ulimit -f` must fail with EFBIG and be reported, not kill the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  // Ctrl-C or SIGTERM mid-run: the files bench and verify created and had not finished are removed, exit 130/143.
  gdskit::install_signal_cleanup();
  CLI::App app{
      "gdskit " GDSKIT_VERSION_STRING
      ": move data between storage and NVIDIA GPU memory as fast as the machine allows, and say how.\n\n"
      "  gdskit doctor            is GPUDirect Storage really working here? layer by layer, with a live proof\n"
      "  gdskit bench -f F -s 1G  gdsio-compatible benchmark that reports the path that actually ran\n"
      "  gdskit verify            write a pattern from GPU memory, read it back, compare every byte\n"
      "  gdskit load MODEL        load safetensors into GPU memory\n"
      "  gdskit tune --path DIR   measure a device and save the profile its transfers start from\n"
      "  gdskit patch / setup     the GeForce BAR1 P2P driver patch and the remaining setup steps\n\n"
      "Settings come from GDSKIT_* environment variables (docs/settings.md).",
      "gdskit"};
  app.require_subcommand(1);
  app.fallthrough();
  using namespace gdskit::cli;
  add_version_command(app);
  add_doctor_command(app);
  add_bench_command(app);
  add_verify_command(app);
  add_load_command(app);
  add_tune_command(app);
  add_patch_command(app);
  add_setup_command(app);
  const std::string version = std::string("gdskit ") + GDSKIT_VERSION_STRING;
  app.set_version_flag("-V,--version", version, "Print the version and exit");
  for (CLI::App* sub : app.get_subcommands({})) {
    // A subcommand with a footer of its own (patch: its note) keeps it; it ends with the table too.
    if (sub->get_footer().empty()) sub->footer(exit_code_footer());
    sub->set_version_flag("--version", version, "Print the version and exit");
  }
  app.footer(exit_code_footer());
  if (unknown_command(app, argc, argv)) return exit_usage;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError&) {
    unknown_argument(app);
    return exit_usage;
  } catch (const CLI::ParseError& e) {
    // --help and --version are CLI11's "errors" of exit code 0: it prints them.
    if (e.get_exit_code() == 0) return app.exit(e) == 0 ? exit_ok : exit_usage;
    // A flag missing, repeated or out of range: named with the command it belongs to, and where to look.
    const CLI::App& where = innermost(app);
    const std::string who = full_name(where);
    fmt::print(stderr, "{}: {} ({} --help lists the flags)\n", who,
               gdskit::printable(gdskit::tools::usage_message(where, e)), who);
    return exit_usage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdskit: {}\n", gdskit::shown_message(e));
    return exit_code_for(e);
  }
  // libcufile 1.15.1 was seen crashing in its own exit handlers (H200 VM): once it has been opened, leave
  // without running library teardown. Files are closed by now and their data is with the kernel. (Processes
  // that exit normally close the driver first, shim::cufile_driver_open's exit handler, which ended that crash
  // in the GPU tests; the CLI keeps leaving this way until a run on the GPU machine shows it is not needed.)
  if (gdskit::shim::cufile_driver_opened()) {
    std::fflush(nullptr);
    std::_Exit(exit_code());
  }
  return exit_code();
}
