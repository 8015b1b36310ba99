#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common/json_text.hpp"
#include "engine/device_profile.hpp"
#include "tools/flag_errors.hpp"
#include "tools/path_line.hpp"
#include "tools/progress.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "tools/verify.hpp"

namespace gdskit::cli {

void add_verify_command(CLI::App& app) {
  struct opts {
    std::string dir = ".";
    std::string file;
    std::string sizes = "4K,1M,64M,1G";
    std::string device = "0";
    std::string mode = "auto";
    std::uint64_t seed = 1;
    std::uint64_t offset = 0;
    bool keep = false;
    bool json = false;
    bool host = false;
    bool learn = false;
    bool verbose = false;
    bool progress = false, no_progress = false;
  };
  auto o = std::make_shared<opts>();
  auto* cmd = app.add_subcommand(
      "verify",
      "Fill GPU memory with a pattern, write it to a file through the chosen path, clear the memory, read it\n"
      "back and compare every byte, for each size. Prints the path, its reasons and GiB/s each way.\n"
      "Without a usable GPU it stops with the reason (exit 2); --host verifies host memory instead.\n"
      "Exit 0 when every byte matched, 1 on any mismatch, 2 on bad input or no GPU, 3 when a transfer failed.\n"
      "Example: gdskit verify -D /mnt/nvme --sizes 4K,1M+1,64M,4G");
  cmd->add_option("-D,--dir", o->dir, "Folder for the test file (the storage under test)")->capture_default_str();
  cmd->add_option("-f,--file", o->file, "Test file (must not exist; removed afterwards unless --keep)");
  cmd->add_option("--sizes", o->sizes, "Comma-separated sizes: 4K, 1M, 1M+1 (odd sizes), 4G")->capture_default_str();
  cmd->add_option("-d,--device", o->device, "GPU index, or 'cpu' for host memory")->capture_default_str();
  cmd->add_option("-x,--mode", o->mode, "Path: auto, gds, staged, compat")->capture_default_str();
  cmd->add_option("-o,--offset", o->offset, "File offset of the data (unaligned allowed)")
      ->capture_default_str()
      ->check(tools::whole_number(0, INT64_MAX));
  cmd->add_option("-k,--seed", o->seed, "Pattern seed")
      ->capture_default_str()
      ->check(tools::whole_number<std::uint64_t>());
  cmd->add_flag("--host", o->host, "Verify host memory (the file path without a GPU)");
  cmd->add_flag("--keep", o->keep, "Keep the test file");
  cmd->add_flag("--json", o->json, "One JSON document on stdout");
  cmd->add_flag("-v,--verbose", o->verbose, "Every reason of the plan (the path line names the first)");
  cmd->add_flag("--learn", o->learn,
                "Start from the shapes earlier loads learned, and remember the one this run converges to (off: a "
                "verification is reproducible and changes nothing for later runs)");
  auto* on = cmd->add_flag("--progress", o->progress, "Progress on stderr even when it is not a terminal");
  cmd->add_flag("--no-progress", o->no_progress, "No progress (the default when stderr is not a terminal or with --json)")
      ->excludes(on);
  cmd->callback([o] {
    tools::verify_options v;
    for (std::size_t pos = 0; pos < o->sizes.size();) {
      std::size_t comma = o->sizes.find(',', pos);
      std::string item = o->sizes.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      pos = comma == std::string::npos ? o->sizes.size() : comma + 1;
      std::uint64_t extra = 0;
      if (auto plus = item.find('+'); plus != std::string::npos) {
        auto e = parse_size(item.substr(plus + 1));
        if (!e) throw CLI::ValidationError("--sizes", "bad size '" + item + "'");
        extra = *e;
        item = item.substr(0, plus);
      }
      auto n = parse_size(item);
      constexpr std::uint64_t max_bytes = INT64_MAX;
      if (!n || *n > max_bytes - extra || *n + extra == 0)
        throw CLI::ValidationError("--sizes", "bad size '" + item + "' (sizes must be > 0 and below 2^63)");
      if (o->offset > max_bytes - (*n + extra))
        throw CLI::ValidationError("--offset", "offset + size passes the largest file offset (2^63 - 1 bytes)");
      v.sizes.push_back(*n + extra);
    }
    auto mode = parse_path_mode(o->mode);
    if (!mode || *mode == path_mode::host) throw CLI::ValidationError("--mode", "expected auto, gds, staged or compat");
    v.config = default_settings();
    v.config.mode = *mode;
    v.config.learn = o->learn;
    v.seed = o->seed;
    v.file_offset = o->offset;
    v.keep_file = o->keep;
    std::string note;
    if (o->host || o->device == "cpu") {
      if (*mode != path_mode::automatic) {
        // Host memory always takes the host path: a GPU path asked for here would silently not be tested.
        fmt::print(stderr, "gdskit verify: -x {} moves GPU memory, but {} verifies host memory (the host path); "
                           "drop -x, or give a GPU with -d N\n",
                   to_string(*mode), o->host ? "--host" : "-d cpu");
        exit_code() = exit_usage;
        return;
      }
      v.device = -1;
      note = "verifying host memory (--host)";
    } else {
      try {
        std::size_t used = 0;
        v.device = std::stoi(o->device, &used);
        if (used != o->device.size()) throw std::invalid_argument(o->device);
      } catch (...) {
        throw CLI::ValidationError("--device", "expected a GPU index or 'cpu'");
      }
      std::string reason;
      if (!gpu_available(&reason)) {
        // Verifying host memory instead would print PASS for a GPU that was never tested.
        fmt::print(stderr, "gdskit verify: no usable GPU: {}. --host verifies host memory instead\n", reason);
        exit_code() = exit_usage;
        return;
      }
      if (v.device < 0 || v.device >= gpu_count()) {
        throw CLI::ValidationError("--device", fmt::format("GPU {} does not exist ({} visible)", v.device, gpu_count()));
      }
    }
    // The folder the test file goes in, named as the user gave it: the file's own name is ours.
    {
      const bool named = !o->file.empty();
      const std::filesystem::path given(o->file);
      const std::string folder = !named ? o->dir : given.has_parent_path() ? given.parent_path().string() : ".";
      if (auto ec = check_folder_argument(folder)) {
        fmt::print(stderr, "gdskit verify: {} {}: {}{}\n", named ? "-f" : "-D", printable(named ? o->file : o->dir),
                   named ? fmt::format("its folder {} ", printable(folder)) : std::string(),
                   folder_argument_problem(ec));
        exit_code() = exit_usage;
        return;
      }
    }
    v.file = o->file.empty() ? std::filesystem::path(o->dir) / fmt::format("gdskit-verify.{}.dat", ::getpid())
                             : std::filesystem::path(o->file);
    // Each line is flushed as it is printed: a run stopped by a signal (SIGTERM exits at once) keeps in a file
    // the lines of the sizes it finished.
    if (!note.empty() && !o->json) {
      fmt::print("note: {}\n", note);
      std::fflush(stdout);
    }
    nlohmann::json out = {{"file", v.file.string()}, {"device", v.device}, {"note", note}, {"results", nlohmann::json::array()}};
    std::optional<bool> progress_flag;
    if (o->progress || o->no_progress) progress_flag = o->progress;
    progress_reporter progress(progress_reporter::choose(progress_flag, o->json));
    std::uint64_t total = 0;  // each size is written and read back; sizes are below 2^63, the sum saturates
    for (auto n : v.sizes) total = 2 * n > UINT64_MAX - total ? UINT64_MAX : total + 2 * n;
    progress.start(total, "verify");
    v.on_bytes = [&progress](std::uint64_t n) { progress.advance(n); };
    bool all_ok = true, mismatch = false;
    std::string last_summary;
    std::vector<tools::verify_result> results;
    auto report = [&](const tools::verify_result& r) {
      progress.clear();  // the result line goes where the progress line was; the next report redraws it
      all_ok = all_ok && r.ok;
      mismatch = mismatch || r.first_mismatch >= 0;
      if (o->json) {
        out["results"].push_back({{"bytes", r.nbytes}, {"ok", r.ok}, {"path", std::string(to_string(r.path.path))},
                                  {"reasons", r.path.reasons}, {"write_gib_s", r.write_gib_s}, {"read_gib_s", r.read_gib_s},
                                  {"first_mismatch", r.first_mismatch}, {"error", r.error}});
        return;
      }
      // The path line once, and again only when it changes (with -v: when any reason does).
      if (std::string line = tools::path_line(to_string(r.path.path), r.path.reasons, o->verbose);
          line != last_summary) {
        fmt::print("path: {}\n", line);
        last_summary = std::move(line);
      }
      fmt::print("{:>12}  {:<4}  write {:7.2f} GiB/s  read {:7.2f} GiB/s  ({})\n", format_size(r.nbytes),
                 r.ok ? "ok" : "FAIL", r.write_gib_s, r.read_gib_s, to_string(r.path.path));
      if (r.first_mismatch >= 0) fmt::print("              first differing byte at offset {}\n", r.first_mismatch);
      if (!r.error.empty()) fmt::print("              {}\n", r.error);
      std::fflush(stdout);
    };
    try {
      results = tools::run_verify(v, report);
    } catch (const gdskit::error& e) {
      // The test file could not be made (it exists, the folder refuses it): nothing was verified.
      progress.finish();
      if (e.code() == std::errc::file_exists) {
        fmt::print(stderr, "gdskit verify: {} exists; verify creates its test file and removes it afterwards: "
                           "give -f a name that does not exist\n", printable(v.file.string()));
      } else {
        fmt::print(stderr, "gdskit verify: {}\n", e.what());
      }
      exit_code() = exit_code_for(e);
      return;
    }
    progress.finish();
    if (o->json) {
      out["ok"] = all_ok;
      fmt::print("{}\n", gdskit::json_text(out));
    } else {
      std::size_t passed = 0;
      for (const auto& r : results) passed += r.ok ? 1 : 0;
      if (all_ok) {
        fmt::print("PASS: {} size{} verified byte for byte\n", results.size(), results.size() == 1 ? "" : "s");
      } else {
        fmt::print("FAIL: {} of {} size{} verified byte for byte; the others failed (above)\n", passed,
                   results.size(), results.size() == 1 ? "" : "s");
      }
    }
    if (const std::string learned = engine::take_learned_notice(); !learned.empty()) {
      fmt::print(stderr, "{}\n", learned);
    }
    // A byte that differs is the verification saying no; a transfer that failed is a run failure.
    exit_code() = all_ok ? exit_ok : mismatch ? exit_said_no : exit_run_failed;
  });
}

}  // namespace gdskit::cli
