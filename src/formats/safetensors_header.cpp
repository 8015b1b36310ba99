// Parsing and validation of safetensors headers.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "common/printable.hpp"

namespace gdskit::safetensors {
namespace {

struct dtype_entry {
  dtype type;
  std::string_view name;
  unsigned bits;
};

constexpr dtype_entry k_dtypes[] = {
    {dtype::BOOL, "BOOL", 8},       {dtype::U8, "U8", 8},           {dtype::I8, "I8", 8},
    {dtype::F8_E5M2, "F8_E5M2", 8}, {dtype::F8_E4M3, "F8_E4M3", 8}, {dtype::F8_E8M0, "F8_E8M0", 8},
    {dtype::F4, "F4", 4},           {dtype::F6_E2M3, "F6_E2M3", 6}, {dtype::F6_E3M2, "F6_E3M2", 6},
    {dtype::I16, "I16", 16},        {dtype::U16, "U16", 16},        {dtype::F16, "F16", 16},
    {dtype::BF16, "BF16", 16},      {dtype::I32, "I32", 32},        {dtype::U32, "U32", 32},
    {dtype::F32, "F32", 32},        {dtype::C64, "C64", 64},        {dtype::F64, "F64", 64},
    {dtype::I64, "I64", 64},        {dtype::U64, "U64", 64},
};

constexpr const char* not_safetensors =
    "not a safetensors file: it does not begin with an 8-byte header length and a JSON object";

[[noreturn]] void bad(std::string_view source, const std::string& what) {
  throw error(errno_code(EBADMSG), "safetensors header", source, -1, 0, what);
}

// The smallest safetensors file: the 8-byte length and "{}".
constexpr std::uint64_t k_min_file_bytes = 10;

[[noreturn]] void too_short(std::string_view source, std::uint64_t file_nbytes) {
  bad(source, fmt::format("not a safetensors file: {} bytes, fewer than an 8-byte header length and a JSON object",
                          file_nbytes));
}

// Returns the offset of the first byte that is a control character or not well-formed UTF-8, or npos.
std::size_t invalid_utf8_at(const unsigned char* s, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    // JSON allows no raw control characters; outside strings only tab, newline and return are whitespace.
    if (s[i] < 0x20 && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return i;
    const std::size_t len = utf8_length_at(s, n, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

// Builds the DOM from SAX events. nlohmann's own DOM parser keeps the last of duplicate keys silently, and its
// callback form rescans the parent object after every child (quadratic in the tensor count), so this builder
// refuses duplicate keys as they arrive (one map insertion each) and nesting deeper than the format needs, so
// that hostile input can build neither deep trees nor slow parses.
class dom_builder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  dom_builder(nlohmann::json& root, std::string_view source) : root_(root), source_(source) {}

  bool null() override { return put(nullptr) != nullptr; }
  bool boolean(bool v) override { return put(v) != nullptr; }
  bool number_integer(number_integer_t v) override { return put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t& text) override {
    if (!std::isfinite(v)) bad(source_, fmt::format("invalid JSON: number {} is out of range", text));
    return put(v) != nullptr;
  }
  bool string(string_t& v) override { return put(std::move(v)) != nullptr; }
  bool binary(binary_t&) override { bad(source_, "invalid JSON: binary value"); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    auto& members = *stack_.back()->get_ptr<nlohmann::json::object_t*>();
    auto [it, inserted] = members.emplace(k, nullptr);
    if (!inserted) {
      bad(source_, stack_.size() == 1 ? fmt::format("duplicate tensor name \"{}\"", printable_name(k))
                                      : fmt::format("duplicate key \"{}\"", printable_name(k)));
    }
    member_ = &it->second;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // The parser quotes the bytes it read last: C1 controls and bidirectional overrides pass the UTF-8 check.
    bad(source_, fmt::format("invalid JSON: {}", printable_name(e.what())));
  }

 private:
  // Stores a value where the grammar puts it: the root, the end of the open array, or the member whose key
  // came last. Returns where it went.
  template <typename V>
  nlohmann::json* put(V&& v) {
    if (stack_.empty()) {
      root_ = nlohmann::json(std::forward<V>(v));
      return &root_;
    }
    nlohmann::json* parent = stack_.back();
    if (parent->is_array()) {
      parent->emplace_back(std::forward<V>(v));
      return &parent->back();
    }
    *member_ = nlohmann::json(std::forward<V>(v));
    return member_;
  }
  bool open(nlohmann::json&& empty) {
    const std::size_t depth = stack_.size();
    if (depth > 2) bad(source_, fmt::format("JSON nested {} levels deep (the format needs 3)", depth + 1));
    stack_.push_back(put(std::move(empty)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  nlohmann::json& root_;
  std::string_view source_;
  std::vector<nlohmann::json*> stack_;  // open objects and arrays, outermost first
  nlohmann::json* member_ = nullptr;    // the member of the innermost object whose key came last
};

// A JSON integer that fits in uint64 and is not negative; `what` names it in the error.
std::uint64_t as_u64(const nlohmann::json& v, std::string_view source, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    bad(source, fmt::format("{} is negative ({})", what, v.get<std::int64_t>()));
  }
  if (v.is_number_float()) bad(source, fmt::format("{} is not an integer ({})", what, v.dump()));
  bad(source, fmt::format("{} is not a number ({})", what, std::string(v.type_name())));
}

}  // namespace

std::string_view to_string(dtype t) noexcept {
  for (const auto& e : k_dtypes) {
    if (e.type == t) return e.name;
  }
  return "?";
}

std::optional<dtype> parse_dtype(std::string_view text) noexcept {
  for (const auto& e : k_dtypes) {
    if (e.name == text) return e.type;
  }
  return std::nullopt;
}

unsigned bits_of(dtype t) noexcept {
  for (const auto& e : k_dtypes) {
    if (e.type == t) return e.bits;
  }
  return 8;
}

std::string printable_name(std::string_view name) { return printable(name); }

std::uint64_t tensor_info::numel() const noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;  // validated not to overflow at parse time
  return n;
}

const tensor_info* header::find(std::string_view name) const noexcept {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

header parse_header(const void* bytes, std::size_t nbytes, std::uint64_t file_nbytes, std::string_view source) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  if (nbytes < 8 || file_nbytes < k_min_file_bytes) too_short(source, file_nbytes);
  std::uint64_t json_len = 0;
  for (int i = 7; i >= 0; --i) json_len = (json_len << 8) | p[i];  // little-endian
  // Every safetensors file's JSON starts with '{': a file whose ninth byte is anything else is another kind of
  // file, and its first eight bytes are no length worth quoting.
  if (nbytes > 8 && file_nbytes > 8 && p[8] != '{') bad(source, not_safetensors);
  if (json_len > max_header_bytes) {
    bad(source, fmt::format("header length {} exceeds the limit of {} bytes (100 MiB)", json_len,
                            max_header_bytes));
  }
  if (json_len > file_nbytes - 8) {
    bad(source, fmt::format("header length {} runs past the end of the {}-byte file", json_len, file_nbytes));
  }
  if (json_len > nbytes - 8) {
    bad(source, fmt::format("header length {} but only {} header bytes given", json_len, nbytes - 8));
  }
  const unsigned char* json_begin = p + 8;
  const std::size_t json_size = static_cast<std::size_t>(json_len);
  if (json_size < 2 || json_begin[0] != '{') bad(source, not_safetensors);
  if (auto at = invalid_utf8_at(json_begin, json_size); at != std::string::npos) {
    bad(source, fmt::format("header is not valid UTF-8 JSON text (byte {} of the JSON is 0x{:02x})", at,
                            json_begin[at]));
  }
  // Writers pad the header with spaces to align the data section; anything else after the object is garbage.
  // nlohmann's parser rejects trailing non-whitespace itself; NUL and other control bytes are refused above.
  std::size_t end = json_size;
  while (end > 0 && json_begin[end - 1] == ' ') --end;

  nlohmann::json root;
  dom_builder builder(root, source);
  try {
    nlohmann::json::sax_parse(json_begin, json_begin + end, &builder, nlohmann::json::input_format_t::json,
                              /*strict=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    bad(source, fmt::format("invalid JSON: {}", printable_name(e.what())));
  }
  if (!root.is_object()) bad(source, "header is not a JSON object");

  header h;
  h.json_nbytes = json_len;
  h.data_offset_bytes = 8 + json_len;
  h.file_nbytes = file_nbytes;
  const std::uint64_t data_nbytes = file_nbytes - h.data_offset_bytes;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const std::string shown = printable_name(name);  // names in messages: they come from the file
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(source, "\"__metadata__\" is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          bad(source, fmt::format("\"__metadata__\" value of \"{}\" is not a string", printable_name(m.key())));
        }
        h.metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    if (!v.is_object()) bad(source, fmt::format("tensor \"{}\" is not an object", shown));
    tensor_info t;
    t.name = name;
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) bad(source, fmt::format("tensor \"{}\" has no string \"dtype\"", shown));
    auto type = parse_dtype(d->get_ref<const std::string&>());
    if (!type) bad(source, fmt::format("tensor \"{}\" has unknown dtype \"{}\"", shown, printable_name(d->get<std::string>())));
    t.dtype = *type;
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) bad(source, fmt::format("tensor \"{}\" has no array \"shape\"", shown));
    if (s->size() > max_rank) {
      bad(source, fmt::format("tensor \"{}\" has {} dimensions (limit {})", shown, s->size(), max_rank));
    }
    // numel x bits must not overflow 64 bits; a zero dimension makes any other dimension harmless.
    bool has_zero = false;
    std::uint64_t numel = 1;
    for (std::size_t i = 0; i < s->size(); ++i) {
      auto dim = as_u64((*s)[i], source, fmt::format("tensor \"{}\" dimension {}", shown, i));
      // Shapes are signed 64-bit everywhere they go (torch, numpy, DLPack): a larger dimension cannot be
      // represented even when a zero dimension makes the tensor empty.
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        bad(source, fmt::format("tensor \"{}\" dimension {} is {}: above 2^63-1", shown, i, dim));
      }
      t.shape.push_back(dim);
      if (dim == 0) has_zero = true;
    }
    if (!has_zero) {
      for (auto dim : t.shape) {
        if (__builtin_mul_overflow(numel, dim, &numel) || numel > (std::numeric_limits<std::uint64_t>::max() >> 6)) {
          bad(source, fmt::format("tensor \"{}\" shape is too large (element count overflows)", shown));
        }
      }
    } else {
      numel = 0;
    }
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2) {
      bad(source, fmt::format("tensor \"{}\" has no \"data_offsets\" of two integers", shown));
    }
    t.begin_bytes = as_u64((*o)[0], source, fmt::format("tensor \"{}\" data_offsets[0]", shown));
    t.end_bytes = as_u64((*o)[1], source, fmt::format("tensor \"{}\" data_offsets[1]", shown));
    if (t.end_bytes < t.begin_bytes) {
      bad(source, fmt::format("tensor \"{}\" data_offsets [{}, {}] end before they begin", shown, t.begin_bytes,
                              t.end_bytes));
    }
    const std::uint64_t bits = numel * bits_of(t.dtype);  // numel <= 2^58, bits <= 64: no overflow
    if (bits % 8 != 0) {
      bad(source, fmt::format("tensor \"{}\": {} elements of {} ({} bits) are not a whole number of bytes", shown,
                              numel, to_string(t.dtype), bits_of(t.dtype)));
    }
    const std::uint64_t want = bits / 8;
    if (want != t.nbytes()) {
      bad(source, fmt::format("tensor \"{}\": shape x {} is {} bytes but data_offsets [{}, {}] span {}", shown,
                              to_string(t.dtype), want, t.begin_bytes, t.end_bytes, t.nbytes()));
    }
    t.file_offset_bytes = h.data_offset_bytes + t.begin_bytes;
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return a.begin_bytes != b.begin_bytes ? a.begin_bytes < b.begin_bytes : a.name < b.name;
  });
  // Offsets past the data section: a file cut short, most often. The tensor that reaches furthest names it (a
  // tensor with bytes before an empty one at the same end), so an empty tensor is blamed only when it alone is
  // out of range.
  const tensor_info* furthest = nullptr;
  for (const auto& t : h.tensors) {
    if (furthest == nullptr || t.end_bytes > furthest->end_bytes ||
        (t.end_bytes == furthest->end_bytes && furthest->nbytes() == 0 && t.nbytes() > 0)) {
      furthest = &t;
    }
  }
  if (furthest != nullptr && furthest->end_bytes > data_nbytes) {
    // Offsets come from the file: the sum can pass 2^64.
    std::uint64_t expected = 0;
    const bool past_2_64 = __builtin_add_overflow(h.data_offset_bytes, furthest->end_bytes, &expected);
    bad(source, fmt::format("file is truncated: expected {} bytes, the file has {} (tensor \"{}\" data_offsets "
                            "[{}, {}] end past its {}-byte data section)",
                            past_2_64 ? std::string("more than 2^64") : std::to_string(expected), file_nbytes,
                            printable_name(furthest->name),
                            furthest->begin_bytes, furthest->end_bytes, data_nbytes));
  }
  // Empty tensors own no bytes, so only non-empty ones can overlap.
  const tensor_info* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.nbytes() == 0) continue;
    if (prev != nullptr && t.begin_bytes < prev->end_bytes) {
      bad(source, fmt::format("tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap", printable_name(prev->name), prev->begin_bytes,
                              prev->end_bytes, printable_name(t.name), t.begin_bytes, t.end_bytes));
    }
    prev = &t;
  }
  return h;
}

header read_header(const file_handle& file) {
  const std::uint64_t size = file.size();
  const std::string source = file.path().string();
  // The length and the first byte of the JSON: enough to tell another kind of file from a damaged one.
  unsigned char len_bytes[9] = {};
  if (size < k_min_file_bytes) too_short(source, size);
  const std::size_t head = size > 8 ? 9 : 8;
  file.read_exact(len_bytes, head, 0);
  std::uint64_t json_len = 0;
  for (int i = 7; i >= 0; --i) json_len = (json_len << 8) | len_bytes[i];
  if (json_len > max_header_bytes || json_len > size - 8 || (head > 8 && len_bytes[8] != '{')) {
    return parse_header(len_bytes, head, size, source);  // throws with the precise reason
  }
  std::vector<unsigned char> buf(8 + static_cast<std::size_t>(json_len));
  std::memcpy(buf.data(), len_bytes, 8);
  file.read_exact(buf.data() + 8, static_cast<std::size_t>(json_len), 8);
  return parse_header(buf.data(), buf.size(), size, source);
}

header read_header(const std::filesystem::path& path) {
  return read_header(open_file(path));
}

}  // namespace gdskit::safetensors
