#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "tools/flag_errors.hpp"
#include "tools/shell_text.hpp"
#include "doctor/doctor.hpp"

namespace gdskit::cli {

void add_doctor_command(CLI::App& app) {
  struct options {
    std::string root = "/";
    std::string path;
    std::string capture;
    bool json = false;
    bool probe = false;
    bool no_probe = false;
    bool no_colour = false;
    bool all = false;
    // The probe process (hidden): one cuFile configuration per process.
    std::string probe_child;
    std::string probe_file;
    std::uint64_t probe_bytes = 16u << 20;
    std::string probe_qd;
  };
  auto opt = std::make_shared<options>();
  auto* cmd = app.add_subcommand(
      "doctor", "Is GPUDirect Storage really working here? Checks each layer, then says true GDS, compat or unusable.\n"
                "Exit code: 0 true GDS, 1 not GDS (compat or unusable), 2 the doctor itself failed.");
  cmd->add_option("--root", opt->root, "Read a captured system root instead of /: a folder (command outputs in ROOT/commands/) or the .tar.gz that --capture writes");
  cmd->add_option("--path", opt->path, "Folder whose storage is checked (default: current folder; for a capture, the captured path)");
  cmd->add_flag("--json", opt->json, "Print the report as JSON (stable keys)");
  cmd->add_option("--capture", opt->capture, "Write the files the checks read and command outputs to OUT.tar.gz");
  cmd->add_flag("--probe", opt->probe, "Run the live cuFile proof (default on a live system with a GPU)");
  cmd->add_flag("--no-probe", opt->no_probe, "Do not run the live cuFile proof");
  cmd->add_flag("--no-color", opt->no_colour, "No colours even on a terminal");
  cmd->add_flag("--all", opt->all,
                "Show every layer even on a machine without a usable NVIDIA GPU (which otherwise gets a few lines)");
  // Hidden (empty group): how the doctor re-runs itself for each cuFile configuration.
  cmd->add_option("--probe-child", opt->probe_child)->group("");
  cmd->add_option("--probe-file", opt->probe_file)->group("");
  cmd->add_option("--probe-bytes", opt->probe_bytes)->group("")->check(tools::whole_number<std::uint64_t>());
  cmd->add_option("--probe-qd", opt->probe_qd)->group("");
  cmd->callback([opt] {
    if (!opt->probe_child.empty()) {
      // Reports on stdout as one marker line; exit 0 whenever a report was written.
      if (opt->probe_file.empty() || (opt->probe_child != "strict" && opt->probe_child != "default")) {
        fmt::print(stderr, "gdskit doctor: --probe-child strict|default needs --probe-file FILE\n");
        exit_code() = 2;
        return;
      }
      std::vector<int> qds;
      std::stringstream ss(opt->probe_qd);
      for (std::string item; std::getline(ss, item, ',');) {
        try {
          int q = std::stoi(item);
          if (q >= 1 && q <= 64) qds.push_back(q);
        } catch (...) {
        }
      }
      auto report = doctor::run_probe_child(opt->probe_child, opt->probe_file, opt->probe_bytes, qds);
      fmt::print("{}", doctor::child_report_line(report));
      std::fflush(stdout);
      // The report is out and the test file is gone: leave without running library teardown (libcufile
      // 1.15.1 was seen to crash in its exit handlers, which would only blur the evidence).
      std::_Exit(0);
    }
    try {
      namespace fs = std::filesystem;
      auto refuse = [](const char* flag, const std::string& value, const std::string& why) {
        fmt::print(stderr, "gdskit doctor: {} {}: {}\n", flag, printable(value), why);
        exit_code() = 2;
      };
      // --root takes a folder or the .tar.gz that --capture writes (unpacked into a private folder).
      std::optional<doctor::private_folder> unpacked;
      std::string root_dir = opt->root;
      std::error_code sec;
      if (!has_control_chars(opt->root) && fs::is_regular_file(opt->root, sec)) {
        unpacked.emplace();
        if (unpacked->error()) return refuse("--root", opt->root, unpacked->error().message());
        std::string why;
        if (auto ec = doctor::extract_capture(opt->root, unpacked->path(), why))
          return refuse("--root", opt->root, "not a capture archive: " + (why.empty() ? ec.message() : why));
        root_dir = unpacked->path().string();
      } else if (auto ec = check_folder_argument(opt->root)) {
        return refuse("--root", opt->root, folder_argument_problem(ec));
      }
      std::error_code cec;
      const bool live = !unpacked && fs::weakly_canonical(root_dir, cec) == fs::path("/");
      if (!opt->path.empty()) {
        if (live) {
          // The storage of a folder that does not exist cannot be judged; checking "/" instead would mislead.
          if (auto ec = check_folder_argument(opt->path)) return refuse("--path", opt->path, folder_argument_problem(ec));
        } else if (has_control_chars(opt->path) || opt->path.front() != '/') {
          return refuse("--path", opt->path, "for a captured root, an absolute path on that system without control characters");
        }
      }
      auto root = live ? doctor::system_root::live_system() : doctor::system_root::captured(root_dir);
      std::string path = opt->path.empty() ? doctor::default_path(root) : opt->path;
      if (live && !opt->path.empty()) path = fs::absolute(path).lexically_normal().string();
      std::optional<doctor::probe_results> probe;
      const bool want_probe = live && !opt->no_probe && (opt->probe || root.exists("proc/driver/nvidia/gpus"));
      if (opt->probe && !live) {
        probe = doctor::probe_results{};
        probe->skipped_reason = "offline root: nothing to probe";
      } else if (want_probe) {
        doctor::probe_options po;
        po.dir = path;
        probe = doctor::run_live_probe(po);
      }
      auto report = doctor::diagnose(root, path, std::move(probe));
      if (unpacked) report.root = opt->root;
      if (opt->json) {
        fmt::print("{}", doctor::render_json(report));
      } else {
        const bool colour = !opt->no_colour && ::isatty(STDOUT_FILENO) != 0 && std::getenv("NO_COLOR") == nullptr;
        fmt::print("{}", doctor::render_text(report, colour, opt->all));
      }
      if (!opt->capture.empty()) {
        std::string why;
        if (auto ec = doctor::write_capture(root, path, opt->capture, why)) {
          fmt::print(stderr, "gdskit doctor: --capture {}: {}\n", printable(opt->capture), why);
          exit_code() = 2;
          return;
        }
        fmt::print(stderr, "capture written to {} ({} files)\n", printable(opt->capture), root.recorded().size());
      }
      std::fflush(stdout);
      exit_code() = report.result.exit_code();
    } catch (const std::exception& e) {
      fmt::print(stderr, "gdskit doctor: {}\n", shown_message(e));
      exit_code() = 2;
    }
  });
}

}  // namespace gdskit::cli
