// gdskit setup plan: the steps after the source patch as a reviewable shell plan; --execute runs it step by step.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "tools/flag_errors.hpp"
#include "tools/programs.hpp"
#include "tools/shell_text.hpp"
#include "patch/patch.hpp"

namespace gdskit::cli {
namespace {

struct setup_flags {
  std::string src;
  std::string root = "/";
  std::string atomics = "default";
  bool registry_dwords = false;
  bool execute = false;
};

}  // namespace

void add_setup_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("setup", "the remaining GDS setup steps after the driver patch");
  cmd->require_subcommand(1);
  auto f = std::make_shared<setup_flags>();
  auto* plan = cmd->add_subcommand("plan", "print the plan as a shell script with its rollback (runs nothing)");
  plan->add_option("--src", f->src, "driver source tree (checkout of NVIDIA/open-gpu-kernel-modules)");
  plan->add_option("--root", f->root, "system root to inspect (a captured system for review elsewhere)");
  plan->add_option("--atomics", f->atomics, "default = ForceP2P 0x211, off = 0x11")
      ->check(tools::one_of({"default", "off"}));
  plan->add_flag("--registry-dwords", f->registry_dwords,
                 "set the BIF overrides through NVreg_RegistryDwords and patch only the HAL half");
  plan->add_flag("--execute", f->execute, "run the plan, asking before each step; stop at the first failure");
  plan->callback([f] {
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--root", &f->root}, {"--src", &f->src}}) {
      if (flag == std::string_view("--src") && value->empty()) continue;  // a placeholder is used
      if (auto ec = check_folder_argument(*value)) {
        fmt::print(stderr, "gdskit setup plan: {} {}: {}\n", flag, printable(*value), folder_argument_problem(ec));
        exit_code() = 2;
        return;
      }
    }
    const auto sys = patch::read_system_facts(f->root);
    patch::plan_options o;
    o.src = f->src;
    o.atomics = f->atomics == "off" ? patch::atomics_mode::off : patch::atomics_mode::default_atomics;
    o.use_registry_dwords = f->registry_dwords;
    const auto steps = patch::make_setup_plan(sys, o);
    fmt::print("{}", patch::render_plan(steps, sys));
    if (!f->execute) return;
    if (f->root != "/") {
      fmt::print(stderr, "gdskit setup plan: --execute runs on this machine; it cannot be combined with --root\n");
      exit_code() = 2;
      return;
    }
    std::size_t n = 0;
    auto ask = [&n, &steps](const patch::plan_step& s) {
      ++n;
      fmt::print("\n[{}/{}] {}{}\n", n, steps.size(), s.title, s.manual ? " (manual)" : "");
      if (!s.command.empty()) fmt::print("  $ {}\n", s.command);
      fmt::print("{} [y/N] ", s.manual ? "Done? Continue" : "Run this step?");
      std::fflush(stdout);
      std::string answer;
      if (!std::getline(std::cin, answer)) return false;
      return answer == "y" || answer == "Y" || answer == "yes";
    };
    auto run = [](const std::string& command) {
      // The shell by its absolute path, its PATH the system folders (and this gdskit's folder, for the steps
      // that run gdskit): a hostile PATH cannot swap the programs the steps name.
      std::string path = tools::system_path;
      std::error_code ec;
      const auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
      if (!ec && !self.empty() && self.find(':') == std::string::npos) path += ":" + self;
      return tools::run_attached("/bin/sh", {"-c", command}, path);
    };
    const auto r = patch::execute_plan(steps, ask, run);
    if (r.failed) {
      fmt::print(stderr, "\nstopped: step \"{}\" failed with status {}; {} step(s) done. See the rollback plan above.\n",
                 r.failed_step, r.failed_status, r.steps_done);
      exit_code() = 1;
    } else if (r.stopped_by_user) {
      fmt::print(stderr, "\nstopped at your request after {} step(s).\n", r.steps_done);
      exit_code() = 1;
    } else {
      fmt::print("\nall {} steps done. `gdskit doctor` is the judge.\n", r.steps_done);
    }
  });
}

}  // namespace gdskit::cli
