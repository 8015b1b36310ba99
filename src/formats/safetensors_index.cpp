// Reading a sharded checkpoint's index.
#include "formats/safetensors_index.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/json_bounded.hpp"
#include "formats/safetensors_open.hpp"
#include "gdskit/error.hpp"

namespace gdskit::formats {
namespace {

[[noreturn]] void bad_index(const std::filesystem::path& p, const std::string& what) {
  throw error(errno_code(EBADMSG), "safetensors index", p.string(), -1, 0, what);
}

}  // namespace

std::vector<safetensors::shard> parse_index(std::string_view json, const std::filesystem::path& index) {
  using safetensors::printable_name;
  std::string why;
  const auto j = parse_json_bounded<nlohmann::json>(json, max_index_json_depth, why);
  // The parser's message may quote bytes of the file.
  if (!j) bad_index(index, fmt::format("invalid JSON: {}", printable_name(why)));
  const auto wm = j->is_object() ? j->find("weight_map") : j->end();
  if (!j->is_object() || wm == j->end() || !wm->is_object()) bad_index(index, "no \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string shown = printable_name(it.key());
    if (!it.value().is_string()) bad_index(index, fmt::format("weight_map entry \"{}\" is not a string", shown));
    const std::filesystem::path rel(it.value().get_ref<const std::string&>());
    if (rel.empty() || rel.is_absolute()) {
      bad_index(index, fmt::format("weight_map entry \"{}\" names no relative file", shown));
    }
    for (const auto& part : rel) {
      if (part == "..") bad_index(index, fmt::format("weight_map entry \"{}\" leaves the folder", shown));
    }
    by_file[rel.string()].push_back(it.key());
  }
  if (by_file.empty()) bad_index(index, "weight_map is empty");
  std::vector<safetensors::shard> out;
  out.reserve(by_file.size());
  for (auto& [file, names] : by_file) out.push_back({index.parent_path() / file, std::move(names)});
  return out;
}

std::vector<safetensors::shard> read_index(const std::filesystem::path& index) {
  return parse_index(read_small_file(index, safetensors::max_header_bytes), index);
}

}  // namespace gdskit::formats
