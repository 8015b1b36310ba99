// gdskit load: loads a safetensors file or sharded checkpoint through the library and reports rate and path.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/json_text.hpp"
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit::cli {
namespace {

struct load_flags {
  std::string path;
  std::string device = "cpu";
  bool checksum = false;
  bool json = false;
  std::vector<std::string> only;
  std::optional<unsigned> rank;
  std::optional<unsigned> world;
  unsigned split_dim = 0;
};

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
      fmt::print(stderr, "gdskit load: --device takes cpu, N or cuda:N, not \"{}\"\n", f.device);
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

  st::model m;
  try {
    m = st::load(f.path, o);
  } catch (const gdskit::error& e) {
    fmt::print(stderr, "gdskit load: {}\n", e.what());
    return 1;
  }
  const auto& s = m.stats();
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
    fmt::print("{}\n", gdskit::json_text(j));
    return 0;
  }
  if (f.checksum) {
    for (std::size_t i = 0; i < m.tensors().size(); ++i) {
      const auto& t = m.tensors()[i];
      fmt::print("{}  {}  {}  {}\n", sums[i], t.name, st::to_string(t.dtype), shape_text(t.shape));
    }
  }
  fmt::print("loaded {} tensors, {} from {} file(s) in {:.3f} s: {:.2f} GiB/s ({} reads; headers {:.3f} s)\n",
             m.tensors().size(), format_size(s.tensor_bytes), s.files, s.seconds, s.gib_per_s(), s.read_requests,
             s.header_seconds);
  fmt::print("path: {}\n", s.path.summary());
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
  cmd->add_option("--rank", flags->rank, "tensor-parallel rank (with --world)");
  cmd->add_option("--world", flags->world, "tensor-parallel world size")->check(CLI::PositiveNumber);
  cmd->add_option("--split-dim", flags->split_dim, "dimension to split across ranks (default 0)");
  cmd->callback([flags] { exit_code() = run_load(*flags); });
}

}  // namespace gdskit::cli
