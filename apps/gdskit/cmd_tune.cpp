#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "commands.hpp"
#include "common/json_text.hpp"
#include "common/printable.hpp"
#include "tools/device_tune.hpp"
#include "tools/profile_store.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::cli {
namespace {

constexpr const char* k_no_folder = "no profile folder: neither XDG_CACHE_HOME nor HOME is set, so nothing is learned or tuned";

// `tune --show`: what the profile folder holds.
void show_profiles(bool json) {
  const auto dir = engine::profile_dir();
  if (dir.empty()) {
    if (json) {
      fmt::print("{}\n", json_text(nlohmann::json{{"folder", nullptr}, {"profiles", nlohmann::json::array()}}, 2));
    } else {
      fmt::print("{}\n", k_no_folder);
    }
    return;
  }
  const auto files = engine::list_profiles(dir);
  fmt::print("{}", json ? tools::profiles_json(dir, files) : tools::render_profiles(dir, files));
}

// The device `arg` names: a block name as given ("nvme0n1"), or for a path (it has a '/', or is . or ..) the
// device holding it. Empty with `why` set when the path does not exist.
std::string device_argument(const std::string& arg, std::string& why) {
  if (arg.find('/') == std::string::npos && arg != "." && arg != "..") return arg;
  struct stat st {};
  if (::stat(arg.c_str(), &st) != 0) {
    why = fmt::format("{}: {}", printable(arg), std::strerror(errno));
    return {};
  }
  const engine::device_identity id = engine::identify_device("/", st.st_dev);
  return id.block.empty() ? id.key : id.block;
}

// `tune --forget [DEVICE] [--all]`: removes a device's profile files (tuned and learned), or all of them.
void forget_profiles(const std::string& device_arg, bool all, const std::string& path, bool json) {
  if (all && !device_arg.empty()) {
    fmt::print(stderr, "gdskit tune: --forget takes a device or --all, not both\n");
    exit_code() = exit_usage;
    return;
  }
  std::string device;
  if (!all) {
    std::string why;
    // No device given: the one holding --path (default: the current folder), as a measurement would use.
    device = device_argument(device_arg.empty() ? path : device_arg, why);
    if (device.empty()) {
      fmt::print(stderr, "gdskit tune: --forget {}; give a device name (gdskit tune --show lists them), a folder "
                         "on the device, or --all\n", why);
      exit_code() = exit_usage;
      return;
    }
  }
  const auto dir = engine::profile_dir();
  tools::forget_result r;
  if (!dir.empty()) r = tools::forget_profiles(engine::list_profiles(dir), device);
  const std::string who = all ? std::string("any device") : printable(device);
  if (json) {
    nlohmann::json removed = nlohmann::json::array();
    for (const auto& f : r.removed) removed.push_back(printable(f.string()));
    fmt::print("{}\n", json_text(nlohmann::json{{"folder", dir.empty() ? nlohmann::json(nullptr)
                                                                         : nlohmann::json(printable(dir.string()))},
                                                 {"device", all ? nlohmann::json(nullptr) : nlohmann::json(who)},
                                                 {"removed", std::move(removed)},
                                                 {"failed", r.failed}},
                                              2));
  } else if (dir.empty()) {
    fmt::print("{}\n", k_no_folder);
  } else if (r.removed.empty() && r.failed.empty()) {
    fmt::print("nothing learned or tuned for {} in {}; nothing removed\n", who, printable(dir.string()));
  } else {
    for (const auto& f : r.removed) fmt::print("removed {}\n", printable(f.string()));
    if (!r.removed.empty()) {
      fmt::print("forgot {} profile file{} of {}: later runs start from the defaults\n", r.removed.size(),
                 r.removed.size() == 1 ? "" : "s", who);
    }
  }
  for (const auto& f : r.failed) fmt::print(stderr, "gdskit tune: could not remove {}\n", f);
  if (!r.failed.empty()) exit_code() = exit_run_failed;
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune",
      "Measure a device's O_DIRECT reads and writes over depth x request size and save its profile.\n"
      "Loads and saves start from it, else from shapes they learned themselves (GDSKIT_LEARN, docs/settings.md);\n"
      "--show lists both, --forget drops them.");
  struct opts {
    std::string dir = ".";
    std::string size = "512M";
    bool json = false;
    bool no_save = false;
    bool no_write = false;
    bool show = false;
    std::string forget;
    bool all = false;
  };
  auto o = std::make_shared<opts>();
  cmd->add_option("--path", o->dir, "Folder on the device to measure (a temporary file is written and removed)");
  cmd->add_option("-s,--size", o->size, "Bytes per measurement (default 512M)");
  cmd->add_flag("--json", o->json, "Print the profile as JSON");
  cmd->add_flag("--no-save", o->no_save, "Measure only; do not write the profile");
  cmd->add_flag("--no-write", o->no_write, "Measure reads only (the write shape copies the read shape)");
  auto* show = cmd->add_flag("--show", o->show,
                             "List what is tuned and learned, per device: file, read and write shapes, when (measures nothing)");
  auto* forget = cmd->add_option("--forget", o->forget,
                                 "Remove the tuned and learned profiles of DEVICE (nvme0n1, or a folder on it; default: "
                                 "the device of --path), or with --all of every device (measures nothing)")
                     ->expected(0, 1)
                     ->type_name("[DEVICE]");
  auto* all = cmd->add_flag("--all", o->all, "With --forget: every device's profiles");
  all->needs(forget);
  show->excludes(forget);
  cmd->callback([o, show, forget] {
    if (show->count() > 0) return show_profiles(o->json);
    if (forget->count() > 0) return forget_profiles(o->forget, o->all, o->dir, o->json);
    auto size = parse_size(o->size);
    if (!size || *size < (1u << 20) || *size > (std::uint64_t{64} << 30)) {
      fmt::print(stderr, "gdskit tune: --size must be 1M..64G\n");
      exit_code() = exit_usage;
      return;
    }
    // A bad GDSKIT_* setting is refused before anything is said to be measured.
    if (bench::settings_refused(std::cerr, "gdskit tune")) {
      exit_code() = exit_usage;
      return;
    }
    tools::tune_options t;
    t.dir = o->dir;
    t.file_bytes = static_cast<std::size_t>(*size);
    t.measure_write = !o->no_write;
    if (!o->json) {
      t.progress = [](const engine::profile_point& p) {
        fmt::print("  {:<5} depth {:>2}  {:>9}  {:7.2f} GiB/s\n", p.dir == engine::io_dir::read ? "read" : "write",
                   p.shape.depth, format_size(p.shape.request_bytes), p.gib_per_s);
        std::fflush(stdout);
      };
      fmt::print("measuring {} per point in {}\n", format_size(*size), printable(o->dir));
    }
    try {
      engine::device_profile p = tools::tune_device(t);
      std::string saved;
      if (!o->no_save) {
        const auto dir = engine::profile_dir();
        if (dir.empty()) {
          saved = "not saved: neither XDG_CACHE_HOME nor HOME is set";
        } else {
          saved = engine::save_profile(dir, p).string();
        }
      }
      if (o->json) {
        fmt::print("{}", engine::profile_json(p));
        return;
      }
      fmt::print("device {} ({})\n", p.device.block.empty() ? "-" : p.device.block, p.device.key);
      fmt::print("best read:  depth {}, {}: {:.2f} GiB/s\n", p.read.depth, format_size(p.read.request_bytes),
                 p.read_gib_per_s);
      if (t.measure_write) {
        fmt::print("best write: depth {}, {}: {:.2f} GiB/s\n", p.write.depth, format_size(p.write.request_bytes),
                   p.write_gib_per_s);
      }
      if (!o->no_save) fmt::print("profile: {}\n", printable(saved));
    } catch (const gdskit::error& e) {
      fmt::print(stderr, "gdskit tune: {}\n", e.what());
      exit_code() = exit_code_for(e);  // a missing or refusing folder is bad input (2), a failed I/O 3
    }
  });
}

}  // namespace gdskit::cli
