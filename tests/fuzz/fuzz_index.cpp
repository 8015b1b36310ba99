// libFuzzer target: a sharded checkpoint's index (*.safetensors.index.json) on untrusted bytes, read as the
// loader reads it (parse_index) and as the saver reads an old index before replacing its shards (bounded parse,
// then the text rewritten). Every input must either give shards that stay inside the index's folder, each with
// names, or throw gdskit::error; a crash, a sanitizer report, another exception type or a broken invariant is
// a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/json_bounded.hpp"
#include "formats/safetensors_index.hpp"
#include "gdskit/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::filesystem::path index = "/fuzz/model.safetensors.index.json";
  try {
    const auto shards = gdskit::formats::parse_index(text, index);
    if (shards.empty()) std::abort();
    for (const auto& s : shards) {
      if (s.names.empty() || s.file.parent_path().empty()) std::abort();
      const auto rel = s.file.lexically_relative("/fuzz");
      if (rel.empty() || rel.is_absolute() || *rel.begin() == "..") std::abort();
      for (const auto& part : rel) {
        if (part == "..") std::abort();
      }
    }
  } catch (const gdskit::error& e) {
    if (e.code().value() != EBADMSG) std::abort();
  }
  // The saver's reading: bounded nesting, then the whole value written out again (recursively).
  std::string why;
  if (const auto j = gdskit::parse_json_bounded<nlohmann::ordered_json>(text, gdskit::max_index_json_depth, why)) {
    const std::string out = j->dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    if (out.empty()) std::abort();
  } else if (why.empty()) {
    std::abort();
  }
  return 0;
}
