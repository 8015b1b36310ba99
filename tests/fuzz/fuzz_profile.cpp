// libFuzzer target: device profiles (written by `gdskit tune`) and learned profiles (written by the library) on
// untrusted bytes. A profile either loads with shapes inside the ranges its parser documents, which every
// client then holds to its own bounds, or is ignored with a reason; a crash, a sanitizer report, an exception
// or a broken invariant is a bug. The seeds carry the device key "wwid=fuzz".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "engine/device_profile.hpp"

namespace en = gdskit::engine;

namespace {

void check_shape(const en::io_shape& s) {
  if (s.depth < 1 || s.depth > 1024) std::abort();
  if (s.request_bytes < 4096 || s.request_bytes > (std::size_t{1} << 30) || s.request_bytes % 4096 != 0) std::abort();
  // Held to a client's bounds, a shape from a file never leaves them.
  for (const bool staged : {false, true}) {
    en::adaptive_limits l;
    l.max_depth = staged ? en::k_staged_max_depth : en::k_host_max_depth;
    l.max_request_bytes = staged ? std::size_t{8} << 20 : en::k_host_max_request_bytes;
    std::string note;
    const auto c = en::clamp_to_limits(s, l, note);
    if (c.depth < l.min_depth || c.depth > l.max_depth) std::abort();
    if (c.request_bytes < l.min_request_bytes || c.request_bytes > l.max_request_bytes) std::abort();
    if ((c == s) != note.empty()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const en::device_identity id{"nvme0n1", "wwid=fuzz"};
  const auto p = en::parse_profile(text, id);
  if (p.profile.has_value() == !p.reason.empty()) std::abort();
  if (p.profile) {
    check_shape(p.profile->read);
    check_shape(p.profile->write);
  }
  const auto l = en::parse_learned(text, id);
  if (l.learned.has_value() == !l.reason.empty()) std::abort();
  if (l.learned) {
    for (const auto& [key, shape] : l.learned->shapes) {
      if (key != "host-read" && key != "host-write" && key != "staged-read" && key != "staged-write") std::abort();
      check_shape(shape.shape);
      if (!(shape.gib_per_s > 0 && shape.gib_per_s < 1e4)) std::abort();
    }
  }
  return 0;
}
