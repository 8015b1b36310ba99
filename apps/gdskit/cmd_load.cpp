// gdskit load: loads a safetensors file or sharded checkpoint through the library and reports rate and path.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common/json_text.hpp"
#include "common/printable.hpp"
#include "engine/device_profile.hpp"
#include "tools/flag_errors.hpp"
#include "tools/path_line.hpp"
#include "tools/progress.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit::cli {
namespace {

struct load_flags {
  std::string path;
  std::string device = "cpu";
  bool checksum = false;
  bool json = false;
  bool verbose = false;        // -v: the plan's every reason
  std::vector<std::string> only;
  std::optional<unsigned> rank;
  std::optional<unsigned> world;
  unsigned split_dim = 0;
  std::string save;            // --save OUT: write what was loaded back out
  std::string max_shard_size;  // --max-shard-size: sharded save
  bool force = false;          // --force: replace existing files
  std::optional<bool> progress;  // --progress / --no-progress (for the save)
};

// The signal (SIGINT, SIGTERM) that stopped a save, 0 while none did.
std::atomic<int> interrupted{0};
extern "C" void on_interrupt(int sig) { interrupted = sig; }

// While this lives, SIGINT and SIGTERM stop a save between pieces, so the library removes its temporary files
// and publishes nothing; the process then exits 128 + the signal (docs/cli.md). A signal inherited as ignored
// stays ignored. The previous handlers return afterwards.
class interrupt_guard {
 public:
  interrupt_guard() {
    interrupted = 0;
    for (int i = 0; i < 2; ++i) {
      struct sigaction sa {};
      sa.sa_handler = on_interrupt;
      sigemptyset(&sa.sa_mask);
      ::sigaction(signals_[i], nullptr, &saved_[i]);
      if (saved_[i].sa_handler != SIG_IGN) ::sigaction(signals_[i], &sa, nullptr);
    }
  }
  ~interrupt_guard() {
    for (int i = 0; i < 2; ++i) ::sigaction(signals_[i], &saved_[i], nullptr);
  }
  interrupt_guard(const interrupt_guard&) = delete;
  interrupt_guard& operator=(const interrupt_guard&) = delete;

 private:
  static constexpr int signals_[2] = {SIGINT, SIGTERM};
  struct sigaction saved_[2] {};
};

struct save_result {
  gdskit::safetensors::save_stats stats;
  bool sharded = false;
};

// Writes the loaded tensors to f.save: one file, or a sharded folder when --max-shard-size is given or the
// target is a folder.
// Whether --save writes a sharded checkpoint (a folder) rather than one file.
bool sharded_save(const load_flags& f) {
  std::error_code ec;
  return !f.max_shard_size.empty() || std::filesystem::is_directory(f.save, ec) || f.save.ends_with('/');
}

// A failed --save, said with the flag that fixes it where there is one (`before`: refused before the load;
// later a missing file is something that changed under the save, not a folder to create). Returns the exit
// code.
int save_failed(const gdskit::error& e, bool before) {
  if (before && e.code() == std::errc::file_exists) {
    fmt::print(stderr, "gdskit load: --save \"{}\": exists; --force replaces it\n", printable(e.path()));
    return exit_usage;
  }
  if (before && (e.code() == std::errc::no_such_file_or_directory || e.code() == std::errc::not_a_directory) &&
      !e.detail().empty()) {
    // The folder is named in the detail ("its folder out does not exist", escaped by the library): said once,
    // with the fix.
    fmt::print(stderr, "gdskit load: --save \"{}\": {} (create the folder first)\n", printable(e.path()), e.detail());
    return exit_usage;
  }
  fmt::print(stderr, "gdskit load: {}\n", e.what());
  return e.code() == std::errc::operation_canceled && interrupted ? 128 + interrupted.load() : exit_code_for(e);
}

// What can be known of the --save target before the model is read: its flags, its folder, an existing file
// without --force. Throws gdskit::error.
void check_save_flags(const load_flags& f) {
  namespace st = gdskit::safetensors;
  if (!f.max_shard_size.empty() && !st::parse_shard_size(f.max_shard_size)) {
    throw gdskit::error(errno_code(EINVAL), fmt::format("--max-shard-size \"{}\": give bytes or 5GB, 500MB, 2GiB",
                                                        printable(f.max_shard_size)));
  }
  // A sharded save creates its folder and names its files from what it loaded: checked when it writes.
  if (!sharded_save(f)) st::check_save_target(f.save, f.force);
}

save_result run_save(const load_flags& f, const gdskit::safetensors::model& m) {
  namespace st = gdskit::safetensors;
  st::save_options so;
  so.overwrite = f.force;
  so.config = default_settings();
  so.cancelled = [] { return interrupted.load() != 0; };
  save_result r;
  r.sharded = sharded_save(f);
  if (!f.max_shard_size.empty()) so.max_shard_bytes = *st::parse_shard_size(f.max_shard_size);
  std::vector<st::save_tensor> tensors;
  tensors.reserve(m.tensors().size());
  for (const auto& t : m.tensors()) tensors.push_back({t.name, t.dtype, t.shape, t.data, {}});
  st::metadata_entries md(m.metadata().begin(), m.metadata().end());
  std::optional<st::metadata_entries> metadata;
  if (!md.empty()) metadata = std::move(md);
  interrupt_guard guard;
  progress_reporter progress(progress_reporter::choose(f.progress, f.json));
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.data.nbytes;
  progress.start(total, "save");
  so.progress = [&progress](std::uint64_t done, std::uint64_t) { progress.update(done); };
  r.stats = r.sharded ? st::save_sharded(f.save, tensors, metadata, so) : st::save(f.save, tensors, metadata, so);
  return r;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int run_load(const load_flags& f) {
  namespace st = gdskit::safetensors;
  st::load_options o;
  if (f.device == "cpu" || f.device == "host") {
    o.device = -1;
  } else {
    std::string d = f.device.starts_with("cuda:") ? f.device.substr(5) : f.device;
    try {
      std::size_t used = 0;
      o.device = std::stoi(d, &used);
      if (used != d.size() || o.device < 0) throw std::invalid_argument(d);
    } catch (const std::exception&) {
      fmt::print(stderr, "gdskit load: --device takes cpu, N or cuda:N, not \"{}\"\n", printable(f.device));
      return 2;
    }
  }
  o.only = f.only;
  if (f.rank || f.world) {
    if (!f.rank || !f.world) {
      fmt::print(stderr, "gdskit load: --rank and --world go together\n");
      return 2;
    }
    o.slice = st::slice_spec{*f.rank, *f.world, f.split_dim};
  }
  o.config = default_settings();
  if (o.device >= 0) {
    // Said before any file is read, with what to do instead.
    if (std::string why; !gpu_available(&why)) {
      fmt::print(stderr, "gdskit load: --device {}: no usable GPU: {}; --device cpu loads into host memory\n",
                 printable(f.device), why);
      return exit_usage;
    }
  }
  if (!f.save.empty()) {
    // A save that cannot happen is refused before the whole model is read.
    try {
      check_save_flags(f);
    } catch (const gdskit::error& e) {
      return save_failed(e, true);
    }
  }

  st::model m;
  try {
    m = st::load(f.path, o);
  } catch (const gdskit::error& e) {
    fmt::print(stderr, "gdskit load: {}\n", e.what());
    return exit_code_for(e);  // a missing or malformed file is bad input (2), a failed read 3
  }
  const auto& s = m.stats();
  std::optional<save_result> saved;
  if (!f.save.empty()) {
    try {
      saved = run_save(f, m);
    } catch (const gdskit::error& e) {
      return save_failed(e, false);
    }
  }
  std::vector<std::string> sums;
  if (f.checksum) {
    for (const auto& t : m.tensors()) sums.push_back(m.sha256_hex(t));
  }
  if (f.json) {
    nlohmann::json j;
    j["path"] = f.path;
    j["device"] = o.device < 0 ? std::string("cpu") : fmt::format("cuda:{}", o.device);
    j["files"] = s.files;
    j["tensors"] = m.tensors().size();
    j["tensor_bytes"] = s.tensor_bytes;
    j["bytes_read"] = s.bytes_read;
    j["read_requests"] = s.read_requests;
    j["seconds"] = s.seconds;
    j["header_seconds"] = s.header_seconds;
    j["alloc_seconds"] = s.alloc_seconds;
    j["overlapped_seconds"] = s.overlapped_seconds;
    j["first_read_seconds"] = s.first_read_seconds;
    j["gib_per_s"] = s.gib_per_s();
    j["data_path"] = std::string(to_string(s.path.path));
    j["reasons"] = s.path.reasons;
    if (o.slice) j["slice"] = {{"rank", o.slice->rank}, {"world", o.slice->world}, {"dim", o.slice->dim}};
    if (f.checksum) {
      auto arr = nlohmann::json::array();
      for (std::size_t i = 0; i < m.tensors().size(); ++i) {
        const auto& t = m.tensors()[i];
        arr.push_back({{"name", t.name}, {"dtype", std::string(st::to_string(t.dtype))}, {"shape", t.shape},
                       {"nbytes", t.data.nbytes}, {"sha256", sums[i]}});
      }
      j["checksums"] = arr;
    }
    if (saved) {
      const auto& v = saved->stats;
      std::vector<std::string> written;
      for (const auto& p : v.written) written.push_back(p.string());
      j["save"] = {{"path", f.save},          {"sharded", saved->sharded},     {"files", written},
                   {"tensor_bytes", v.tensor_bytes}, {"file_bytes", v.file_bytes}, {"seconds", v.seconds},
                   {"sync_seconds", v.sync_seconds}, {"gib_per_s", v.gib_per_s()},
                   {"data_path", std::string(to_string(v.path.path))}, {"reasons", v.path.reasons}};
    }
    fmt::print("{}\n", gdskit::json_text(j));
    return 0;
  }
  if (f.checksum) {
    for (std::size_t i = 0; i < m.tensors().size(); ++i) {
      const auto& t = m.tensors()[i];
      // Names come from the file: escaped, so that a newline or ESC in one cannot forge lines or drive
      // the terminal.
      fmt::print("{}  {}  {}  {}\n", sums[i], st::printable_name(t.name), st::to_string(t.dtype),
                 shape_text(t.shape));
    }
  }
  fmt::print(
      "loaded {} tensors, {} from {} file(s) in {:.3f} s: {:.2f} GiB/s ({} reads; headers {:.3f} s, {:.3f} s of "
      "header and allocation work behind reads)\n",
      m.tensors().size(), format_size(s.tensor_bytes), s.files, s.seconds, s.gib_per_s(), s.read_requests,
      s.header_seconds, s.overlapped_seconds);
  fmt::print("path: {}\n", tools::path_line(to_string(s.path.path), s.path.reasons, f.verbose));
  if (saved) {
    const auto& v = saved->stats;
    fmt::print("saved {} to {} ({} file(s){}) in {:.3f} s: {:.2f} GiB/s (syncs {:.3f} s)\n", format_size(v.tensor_bytes),
               printable(f.save), v.files, v.written.size() > v.files ? " + index" : "", v.seconds, v.gib_per_s(),
               v.sync_seconds);
    fmt::print("save path: {}\n", tools::path_line(to_string(v.path.path), v.path.reasons, f.verbose));
  }
  return 0;
}

}  // namespace

void add_load_command(CLI::App& app) {
  auto flags = std::make_shared<load_flags>();
  auto* cmd = app.add_subcommand("load", "Load a safetensors file or sharded checkpoint; report rate and data path");
  cmd->add_option("path", flags->path, "FILE.safetensors, *.safetensors.index.json, or a folder")->required();
  cmd->add_option("--device", flags->device, "cpu (default), N or cuda:N");
  cmd->add_flag("--checksum", flags->checksum, "print name, dtype, shape and sha256 of each tensor's raw bytes");
  cmd->add_flag("--json", flags->json, "machine-readable output");
  cmd->add_option("--only", flags->only,
                  "tensor names to load; an entry ending in '.' or '*' is a prefix (repeatable)");
  cmd->add_option("--rank", flags->rank, "tensor-parallel rank (with --world)")
      ->check(tools::whole_number<unsigned>());
  cmd->add_option("--world", flags->world, "tensor-parallel world size")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return v.find_first_not_of("0123456789") == std::string::npos && v.find_first_not_of('0') != std::string::npos
                       ? std::string()
                       : "must be a whole number of at least 1 (the ranks that share the tensors)";
          },
          "N>=1"))
      ->check(tools::whole_number(1, UINT32_MAX));
  cmd->add_option("--split-dim", flags->split_dim, "dimension to split across ranks (default 0)")
      ->check(tools::whole_number<unsigned>());
  cmd->add_option("--save", flags->save,
                  "write the loaded tensors to OUT (a .safetensors file, or a folder for a sharded checkpoint); "
                  "prints the save rate too");
  cmd->add_option("--max-shard-size", flags->max_shard_size,
                  "with --save: a sharded checkpoint with shards of at most this much tensor data "
                  "(5GB = 5*10^9 bytes as in huggingface_hub, 2GiB binary, or bytes)");
  cmd->add_flag("--force", flags->force, "with --save: replace existing files");
  cmd->add_flag_callback("--progress", [flags] { flags->progress = true; },
                         "with --save: progress on stderr even when it is not a terminal");
  cmd->add_flag_callback("--no-progress", [flags] { flags->progress = false; },
                         "with --save: no progress (the default when stderr is not a terminal or with --json)");
  cmd->add_flag("-v,--verbose", flags->verbose, "every reason of the plan (the path line names the first)");
  cmd->callback([flags] {
    exit_code() = run_load(*flags);
    // Loads and saves may remember the shape their transfers converged to (GDSKIT_LEARN): said in one line.
    if (const std::string learned = engine::take_learned_notice(); !learned.empty()) {
      fmt::print(stderr, "{}\n", learned);
    }
  });
}

}  // namespace gdskit::cli
