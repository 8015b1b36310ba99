#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <system_error>

#include "commands.hpp"
#include "gdskit/error.hpp"
#include "gdskit/version.hpp"
#include "shim/cufile.hpp"

namespace gdskit::cli {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace gdskit::cli

int main(int argc, char** argv) {
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 uses 0 for --help; usage errors are 2 like other Unix tools.
    return rc == 0 ? 0 : 2;
  } catch (const gdskit::error& e) {
    fmt::print(stderr, "gdskit: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdskit: {}\n", e.what());
    return 2;
  }
  // libcufile 1.15.1 was seen crashing in its own exit handlers (H200 VM): once it has been opened, leave
  // without running library teardown. Files are closed by now and their data is with the kernel.
  if (gdskit::shim::cufile_driver_opened()) {
    std::fflush(nullptr);
    std::_Exit(exit_code());
  }
  return exit_code();
}
