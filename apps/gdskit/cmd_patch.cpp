// gdskit patch: check / apply / revert / diff the GeForce BAR1 P2P edits on a driver source tree, and print the
// NVreg_RegistryDwords alternative. The work is in src/patch; this file parses flags and prints.
#include <fmt/format.h>

#include <map>
#include <memory>

#include "commands.hpp"
#include "tools/flag_errors.hpp"
#include "tools/session_once.hpp"
#include "tools/shell_text.hpp"
#include "patch/patch.hpp"
#include "patch/report.hpp"

namespace gdskit::cli {
namespace {

struct patch_flags {
  std::string src;
  std::string atomics = "default";
  std::string only = "all";
  std::string driver_version;
  bool force = false;
  bool json = false;
};

patch::patch_options to_options(const patch_flags& f) {
  patch::patch_options o;
  o.atomics = f.atomics == "off" ? patch::atomics_mode::off : patch::atomics_mode::default_atomics;
  o.only = f.only == "bif" ? patch::edit_group::bif : f.only == "hal" ? patch::edit_group::hal : patch::edit_group::all;
  o.force = f.force;
  return o;
}

void add_common(CLI::App* cmd, patch_flags& f, bool with_json) {
  cmd->add_option("--src", f.src, "checkout of NVIDIA/open-gpu-kernel-modules (the folder with version.mk)")
      ->required();
  cmd->add_option("--atomics", f.atomics,
                  "ForceP2P value: default = 0x211 (P2P atomics at chipset default), off = 0x11 (forced off, "
                  "known to work on GeForce)")
      ->check(tools::one_of({"default", "off"}));
  cmd->add_option("--only", f.only, "edit only the BIF overrides (kernel_bif.c) or the HAL renames (g_kern_bus_nvoc.c)")
      ->check(tools::one_of({"all", "bif", "hal"}));
  cmd->add_flag("--force", f.force,
                "accept a driver version gdskit has not checked (edits taken from the files as found; a wrong "
                "enum can silently select another P2P type), and let revert restore a backup over later changes");
  if (with_json) cmd->add_flag("--json", f.json, "print the report as JSON");
}

// --src must be an existing folder with a printable name; says why and sets exit code 2 otherwise.
bool src_ok(const std::string& src, std::string_view cmd) {
  if (auto ec = check_folder_argument(src)) {
    fmt::print(stderr, "gdskit {}: --src {}: {}\n", cmd, printable(src), folder_argument_problem(ec));
    exit_code() = 2;
    return false;
  }
  return true;
}

// The note on what the patch does not prove: in every --help, and in text output once per terminal session
// (tools/session_once.hpp), so that it is read without burying every later report; never in --json.
void print_note(std::FILE* to) {
  if (tools::first_in_session("patch-note")) fmt::print(to, "\n{}", patch::honesty_note());
}

std::string help_footer() {
  return fmt::format("{}(Outside --help this note is printed once per terminal session: docs/patch.md.)\n\n{}",
                     patch::honesty_note(), exit_code_footer());
}

void finish(const patch::tree_report& r, const patch_flags& f, std::string_view op) {
  if (f.json) {
    fmt::print("{}", patch::render_json(r));
  } else {
    fmt::print("{}", patch::render_text(r, op));
    if (op == "diff" && !r.refused) fmt::print("\n{}", r.diff.empty() ? "(no change: already applied)\n" : r.diff);
    print_note(stdout);
  }
  exit_code() = r.refused ? 1 : 0;
}

}  // namespace

void add_patch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "patch",
      "the GeForce BAR1 P2P edits of NVIDIA's open kernel module: check, apply, revert, diff; registry-dwords");
  cmd->require_subcommand(1);
  auto flags = std::make_shared<patch_flags>();

  auto* check = cmd->add_subcommand("check", "report each edit: original / applied / unknown (writes nothing)");
  add_common(check, *flags, true);
  check->callback([flags] {
    if (!src_ok(flags->src, "patch check")) return;
    finish(patch::check_tree(flags->src, to_options(*flags)), *flags, "check");
  });

  auto* apply = cmd->add_subcommand("apply", "apply all edits, atomically, keeping FILE.gdskit-orig backups");
  add_common(apply, *flags, true);
  apply->callback([flags] {
    if (src_ok(flags->src, "patch apply")) finish(patch::apply_tree(flags->src, to_options(*flags)), *flags, "apply");
  });

  auto* revert = cmd->add_subcommand("revert", "restore the original files byte for byte");
  add_common(revert, *flags, true);
  revert->callback([flags] {
    if (src_ok(flags->src, "patch revert")) finish(patch::revert_tree(flags->src, to_options(*flags)), *flags, "revert");
  });

  auto* diff = cmd->add_subcommand("diff", "print the unified diff apply would write (writes nothing)");
  add_common(diff, *flags, true);
  diff->callback([flags] {
    if (!src_ok(flags->src, "patch diff")) return;
    auto r = patch::diff_tree(flags->src, to_options(*flags));
    if (!flags->json && !r.refused) {
      // Plain diff on stdout so it can be piped to `patch -p1`; the report goes to stderr.
      fmt::print(stderr, "{}", patch::render_text(r, "diff"));
      fmt::print("{}", r.diff);
      print_note(stderr);
      exit_code() = 0;
      return;
    }
    finish(r, *flags, "diff");
  });

  auto* rd = cmd->add_subcommand(
      "registry-dwords",
      "print the NVreg_RegistryDwords value that sets the three BIF overrides with no source change");
  rd->add_option("--driver-version", flags->driver_version, "driver version (default: from --src, else the loaded driver)");
  rd->add_option("--src", flags->src, "driver source tree to read the version from");
  rd->add_option("--atomics", flags->atomics, "default = 0x211, off = 0x11")->check(tools::one_of({"default", "off"}));
  rd->add_flag("--force", flags->force, "print a value for a driver series gdskit has not checked");
  rd->callback([flags] {
    // stdout is a modprobe.d file (`... > /etc/modprobe.d/gdskit-p2p.conf`); everything else goes to stderr.
    auto refuse = [](const std::string& why) {
      fmt::print(stderr, "gdskit patch registry-dwords: {}\n", why);
      exit_code() = 2;
    };
    patch::driver_version v;
    std::string from;
    if (!flags->driver_version.empty()) {
      auto p = patch::parse_version(flags->driver_version);
      if (!p) return refuse(fmt::format("\"{}\" is not a driver version (like 580.142)", printable(flags->driver_version)));
      v = *p;
      from = "--driver-version";
    } else if (!flags->src.empty()) {
      if (!src_ok(flags->src, "patch registry-dwords")) return;
      v = patch::check_tree(flags->src, {}).facts.version;
      from = "version.mk";
      if (!v.known()) return refuse("no NVIDIA_VERSION in " + printable(flags->src) + "/version.mk; give --driver-version");
    } else {
      auto sys = patch::read_system_facts("/");
      if (auto p = patch::parse_version(sys.loaded_driver_version)) {
        v = *p;
        from = "loaded module";
      } else {
        return refuse("no nvidia module is loaded and no --src or --driver-version was given: the value depends "
                      "on the driver version");
      }
    }
    if (!patch::version_supported(v) && !flags->force) {
      return refuse(fmt::format("driver {} ({}) is not a series gdskit knows (550 to 595), the one `patch check` "
                                "refuses; --force prints a value anyway",
                                v.text, from));
    }
    auto r = patch::make_registry_dwords(
        v, flags->atomics == "off" ? patch::atomics_mode::off : patch::atomics_mode::default_atomics);
    fmt::print("{}", r.modprobe_conf);
    fmt::print(stderr, "driver {} ({})\n", v.text, from);
    for (const auto& n : r.notes) fmt::print(stderr, "note: {}\n", n);
    print_note(stderr);
  });
  cmd->footer(help_footer());
  for (CLI::App* sub : cmd->get_subcommands({})) sub->footer(help_footer());
}

}  // namespace gdskit::cli
