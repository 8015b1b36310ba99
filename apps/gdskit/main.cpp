#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <system_error>

#include "commands.hpp"
#include "common/terminal.hpp"
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
      return exit_usage;
    default:
      return exit_run_failed;
  }
}

}  // namespace gdskit::cli

int main(int argc, char** argv) {
  // A write past `ulimit -f` must fail with EFBIG and be reported, not kill the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "gdskit " GDSKIT_VERSION_STRING
      ": move data between storage and NVIDIA GPU memory as fast as the machine allows, and say how.\n\n"
      "  gdskit doctor            is GPUDirect Storage really working here? layer by layer, with a live proof\n"
      "  gdskit bench -f F -s 1G  gdsio-compatible benchmark that reports the path that actually ran\n"
      "  gdskit verify            write a pattern from GPU memory, read it back, compare every byte\n"
      "  gdskit load MODEL        load safetensors into GPU memory\n"
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
  add_patch_command(app);
  add_setup_command(app);
  for (CLI::App* sub : app.get_subcommands({})) sub->footer(exit_code_footer());
  app.footer(exit_code_footer());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 uses 0 for --help; usage errors are 2 like other Unix tools.
    return rc == 0 ? exit_ok : exit_usage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdskit: {}\n", gdskit::printable(e.what()));
    return exit_code_for(e);
  }
  // libcufile 1.15.1 was seen crashing in its own exit handlers (H200 VM): once it has been opened, leave
  // without running library teardown. Files are closed by now and their data is with the kernel.
  if (gdskit::shim::cufile_driver_opened()) {
    std::fflush(nullptr);
    std::_Exit(exit_code());
  }
  return exit_code();
}
