#include "tools/profile_store.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_text.hpp"
#include "common/printable.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::tools {
namespace {

// The name a device is listed under: its block name, else its identity key.
std::string device_label(const engine::stored_profile& p) {
  if (!p.device.block.empty()) return p.device.block;
  if (!p.device.key.empty()) return p.device.key;
  return "(device unknown)";
}

// One shape of a file: what it is for, depth x request size, the rate it held and when it was measured.
struct shape_row {
  std::string name;  // "host reads", "staged writes" (learned); "reads", "writes" (tuned)
  engine::io_shape shape;
  double gib_per_s = 0;
  std::string when;
};

std::vector<shape_row> rows_of(const engine::stored_profile& p) {
  std::vector<shape_row> out;
  if (p.tuned) {
    out.push_back({"reads", p.tuned->read, p.tuned->read_gib_per_s, p.tuned->created});
    out.push_back({"writes", p.tuned->write, p.tuned->write_gib_per_s, p.tuned->created});
  }
  if (p.shapes) {
    for (const auto& [key, ls] : p.shapes->shapes) {
      std::string name = key;
      if (auto dash = name.find('-'); dash != std::string::npos) name[dash] = ' ';
      out.push_back({name + "s", ls.shape, ls.gib_per_s, ls.updated});
    }
  }
  for (auto& r : out) r.when = printable(r.when);  // checked as a timestamp for learned files, not for tuned
  return out;
}

// The part of "learned-nvme0n1-0123abcd.json" between the kind and the hash: the block name it was made for.
std::string block_in_file_name(const std::filesystem::path& file) {
  std::string name = file.filename().string();
  const auto first = name.find('-');
  const auto last = name.rfind('-');
  if (first == std::string::npos || last == std::string::npos || last <= first) return {};
  return name.substr(first + 1, last - first - 1);
}

}  // namespace

std::string render_profiles(const std::filesystem::path& dir, const std::vector<engine::stored_profile>& files) {
  std::string out = fmt::format("profile folder: {}\n", printable(dir.string()));
  if (files.empty()) return out + "nothing learned or tuned: loads and saves start from the defaults\n";
  // Grouped by device, in the order the devices first appear.
  std::vector<std::string> devices;
  for (const auto& f : files) {
    if (std::find(devices.begin(), devices.end(), device_label(f)) == devices.end()) devices.push_back(device_label(f));
  }
  for (const auto& d : devices) {
    out += d;
    for (const auto& f : files) {
      if (device_label(f) == d && !f.device.key.empty() && f.device.key != d) {
        out += fmt::format(" ({})", f.device.key);
        break;
      }
    }
    out += "\n";
    for (const auto& f : files) {
      if (device_label(f) != d) continue;
      const char* kind = f.learned ? "learned" : "tuned";
      if (!f.reason.empty()) {
        out += fmt::format("  {:<8} not used: {}\n", kind, f.reason);
      }
      for (const auto& r : rows_of(f)) {
        out += fmt::format("  {:<8} {:<14} depth {:>2} x {:<10} {:>7.2f} GiB/s  {}\n", kind, r.name, r.shape.depth,
                           format_size(r.shape.request_bytes), r.gib_per_s, r.when.empty() ? "-" : r.when);
      }
      out += fmt::format("  {:<8} file {}\n", "", printable(f.file.string()));
    }
  }
  out += "gdskit tune --forget DEVICE drops a device's profiles; --forget --all drops every one.\n";
  return out;
}

std::string profiles_json(const std::filesystem::path& dir, const std::vector<engine::stored_profile>& files) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : files) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const auto& r : rows_of(f)) {
      shapes.push_back({{"name", r.name}, {"depth", r.shape.depth}, {"request_bytes", r.shape.request_bytes},
                        {"gib_per_s", r.gib_per_s}, {"when", r.when}});
    }
    list.push_back({{"file", printable(f.file.string())},
                    {"kind", f.learned ? "learned" : "tuned"},
                    {"device", {{"block", f.device.block}, {"key", f.device.key}}},
                    {"shapes", std::move(shapes)},
                    {"ignored", f.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.reason)}});
  }
  return json_text(nlohmann::json{{"folder", printable(dir.string())}, {"profiles", std::move(list)}}, 2) + "\n";
}

bool profile_matches(const engine::stored_profile& file, std::string_view device) {
  if (device.empty()) return false;
  if (file.device.block == device || file.device.key == device) return true;
  return file.device.block.empty() && file.device.key.empty() && block_in_file_name(file.file) == device;
}

forget_result forget_profiles(const std::vector<engine::stored_profile>& files, std::string_view device) {
  forget_result r;
  for (const auto& f : files) {
    if (!device.empty() && !profile_matches(f, device)) continue;
    std::error_code ec;
    if (std::filesystem::remove(f.file, ec)) {
      r.removed.push_back(f.file);
    } else if (ec) {
      r.failed.push_back(fmt::format("{}: {}", printable(f.file.string()), ec.message()));
    }
  }
  return r;
}

}  // namespace gdskit::tools
