#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "tools/device_tune.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::cli {

void add_tune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune", "Measure a device's O_DIRECT reads and writes over depth x request size and save its profile");
  struct opts {
    std::string dir = ".";
    std::string size = "512M";
    bool json = false;
    bool no_save = false;
    bool no_write = false;
  };
  auto o = std::make_shared<opts>();
  cmd->add_option("--path", o->dir, "Folder on the device to measure (a temporary file is written and removed)");
  cmd->add_option("-s,--size", o->size, "Bytes per measurement (default 512M)");
  cmd->add_flag("--json", o->json, "Print the profile as JSON");
  cmd->add_flag("--no-save", o->no_save, "Measure only; do not write the profile");
  cmd->add_flag("--no-write", o->no_write, "Measure reads only (the write shape copies the read shape)");
  cmd->callback([o] {
    auto size = parse_size(o->size);
    if (!size || *size < (1u << 20) || *size > (std::uint64_t{64} << 30)) {
      fmt::print(stderr, "gdskit tune: --size must be 1M..64G\n");
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
      fmt::print("measuring {} per point in {}\n", format_size(*size), o->dir);
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
      if (!o->no_save) fmt::print("profile: {}\n", saved);
    } catch (const gdskit::error& e) {
      fmt::print(stderr, "gdskit tune: {}\n", e.what());
      exit_code() = exit_code_for(e);  // a missing or refusing folder is bad input (2), a failed I/O 3
    }
  });
}

}  // namespace gdskit::cli
