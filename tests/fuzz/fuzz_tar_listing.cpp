// libFuzzer target: the tar reader that checks capture archives for `gdskit doctor --root ARCHIVE`.
// Any bytes must be refused with a reason or passed on as members whose invariants hold: relative names without
// "..", control bytes or empty parts, exactly the declared bytes per member, totals within the limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "doctor/tar_reader.hpp"

namespace gd = gdskit::doctor;

namespace {

struct checking_sink : gd::tar_sink {
  gd::tar_limits limits;
  std::uint64_t expected = 0, got = 0, total = 0;
  std::size_t members = 0;
  bool open = false;
  std::error_code begin(const gd::tar_member& m) override {
    if (open || m.name.empty() || m.name.front() == '/' || m.name.back() == '/') std::abort();
    if (m.name.size() > limits.max_name_bytes) std::abort();
    for (unsigned char c : m.name)
      if (c < 0x20 || c == 0x7f) std::abort();
    for (std::size_t i = 0; i <= m.name.size();) {
      auto j = m.name.find('/', i);
      if (j == std::string::npos) j = m.name.size();
      const std::string part = m.name.substr(i, j - i);
      if (part.empty() || part == "." || part == "..") std::abort();
      i = j + 1;
    }
    if (m.directory && m.size != 0) std::abort();
    if (++members > limits.max_members) std::abort();
    total += m.size;
    if (total > limits.max_total_bytes) std::abort();
    expected = m.size;
    got = 0;
    open = true;
    return {};
  }
  std::error_code data(std::string_view b) override {
    if (!open) std::abort();
    got += b.size();
    if (got > expected) std::abort();
    return {};
  }
  std::error_code end() override {
    if (!open || got != expected) std::abort();
    open = false;
    return {};
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The first byte picks the piece size the stream is fed in (the reader must not care) and small limits, so
  // short inputs reach the limit checks too.
  if (size == 0) return 0;
  const std::size_t step = 1 + data[0] % 97;
  checking_sink sink;
  sink.limits.max_members = 1 + data[0] % 5;
  sink.limits.max_total_bytes = (data[0] & 0x80) ? 4096 : (512ull << 20);
  sink.limits.max_name_bytes = (data[0] & 0x40) ? 64 : 4096;
  gd::tar_reader reader(sink, sink.limits);
  const std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  std::error_code ec;
  for (std::size_t i = 0; i < all.size() && !ec; i += step) ec = reader.feed(all.substr(i, step));
  if (!ec) ec = reader.finish();
  if (ec && reader.why().empty()) std::abort();
  if (!ec && sink.open) std::abort();
  if (reader.members() > sink.limits.max_members || reader.total_bytes() > sink.limits.max_total_bytes) std::abort();
  return 0;
}
