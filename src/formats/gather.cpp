// .npy headers and row gathers.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "gdskit/error.hpp"
#include "gdskit/gather.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit {

namespace {

constexpr std::size_t k_max_header_bytes = std::size_t{1} << 20;

[[noreturn]] void bad(const file_handle& f, const std::string& what) {
  throw error(errno_code(EBADMSG), "npy header", f.path().string(), -1, 0, what);
}

// A cursor over the header's dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class dict_reader {
 public:
  dict_reader(const file_handle& f, std::string_view text) : f_(f), s_(text) {}

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* where) {
    if (!eat(c)) bad(f_, fmt::format("malformed header: expected '{}' {}", c, where));
  }
  std::string string() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) {
      bad(f_, "malformed header: expected a quoted string (a structured dtype is not supported)");
    }
    const char q = s_[i_++];
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') bad(f_, "malformed header: escapes in strings are not supported");
      ++i_;
    }
    if (i_ >= s_.size()) bad(f_, "malformed header: unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  bool boolean() {
    skip_space();
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    bad(f_, "malformed header: expected True or False");
  }
  std::vector<std::uint64_t> tuple() {
    expect('(', "before the shape");
    std::vector<std::uint64_t> out;
    for (;;) {
      if (eat(')')) return out;
      skip_space();
      std::uint64_t v = 0;
      std::size_t digits = 0;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) != 0) {
        const unsigned d = static_cast<unsigned>(s_[i_++] - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) bad(f_, "shape dimension too large");
        v = v * 10 + d;
        ++digits;
      }
      if (digits == 0) bad(f_, "malformed header: expected a dimension in the shape");
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long literals
      out.push_back(v);
      if (out.size() > 64) bad(f_, "shape has more than 64 dimensions");
      if (!eat(',')) {
        expect(')', "after the shape");
        return out;
      }
    }
  }

 private:
  const file_handle& f_;
  std::string_view s_;
  std::size_t i_ = 0;
};

std::size_t itemsize_of(const file_handle& f, const std::string& descr) {
  std::string why;
  const auto t = parse_npy_type(descr, &why);
  if (!t) bad(f, why);
  return t->itemsize;
}

}  // namespace

std::optional<npy_type> parse_npy_type(std::string_view descr, std::string* why) {
  auto refuse = [&](std::string text) -> std::optional<npy_type> {
    if (why != nullptr) *why = std::move(text);
    return std::nullopt;
  };
  const std::string shown(descr.substr(0, 32));
  if (descr.size() < 2 || std::string_view("<>|=").find(descr[0]) == std::string_view::npos) {
    return refuse("dtype '" + safetensors::printable_name(shown) + "' is not a simple numpy type");
  }
  const char kind = descr[1];
  if (std::string_view("biufcSV").find(kind) == std::string_view::npos) {
    return refuse(fmt::format("dtype kind '{}' is not supported (bool, integers, floats, complex, bytes)",
                              safetensors::printable_name(std::string_view(&kind, 1))));
  }
  const std::string_view digits = descr.substr(2);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    return refuse("dtype '" + safetensors::printable_name(shown) + "' has no item size");
  }
  std::size_t n = 0;
  for (char c : digits) n = n * 10 + static_cast<std::size_t>(c - '0');
  if (n == 0) return refuse("dtype has item size 0");
  return npy_type{descr[0], kind, n};
}

row_layout npy_header::rows() const {
  row_layout r;
  r.data_offset_bytes = data_offset_bytes;
  r.nrows = shape.empty() ? 1 : shape.front();
  std::size_t per_row = itemsize;
  for (std::size_t k = 1; k < shape.size(); ++k) per_row *= static_cast<std::size_t>(shape[k]);
  r.row_bytes = per_row;
  return r;
}

npy_header read_npy_header(const file_handle& f) {
  std::uint8_t pre[12] = {};
  const std::size_t got = f.pread(pre, sizeof pre, 0);
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) bad(f, "not a .npy file (no \\x93NUMPY magic)");
  const unsigned major = pre[6];
  std::size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = pre[8] | (std::size_t{pre[9]} << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (got < 12) bad(f, "header cut short");
    header_len = pre[8] | (std::size_t{pre[9]} << 8) | (std::size_t{pre[10]} << 16) | (std::size_t{pre[11]} << 24);
    start = 12;
  } else {
    bad(f, fmt::format(".npy format version {} is not supported (1, 2 or 3)", major));
  }
  if (header_len > k_max_header_bytes) bad(f, fmt::format("header of {} bytes exceeds the 1 MiB limit", header_len));
  std::string text(header_len, '\0');
  if (f.pread(text.data(), header_len, start) != header_len) bad(f, "header cut short");
  npy_header h;
  h.data_offset_bytes = start + header_len;
  dict_reader d(f, text);
  d.expect('{', "at the start of the header");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!d.eat('}')) {
    const std::string key = d.string();
    d.expect(':', "after a key");
    if (key == "descr") {
      h.descr = d.string();
      have_descr = true;
    } else if (key == "fortran_order") {
      h.fortran_order = d.boolean();
      have_order = true;
    } else if (key == "shape") {
      h.shape = d.tuple();
      have_shape = true;
    } else {
      bad(f, "unexpected key in the header");
    }
    if (!d.eat(',')) {
      d.expect('}', "at the end of the header");
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) bad(f, "header lacks descr, fortran_order or shape");
  h.itemsize = itemsize_of(f, h.descr);
  if (h.fortran_order) {
    throw error(errno_code(ENOTSUP), "npy header", f.path().string(), -1, 0,
                "Fortran-order arrays are not supported: rows are not contiguous");
  }
  // The array must fit in a file: no product may overflow, and the file must hold it all.
  std::uint64_t total = h.itemsize;
  for (std::uint64_t dim : h.shape) {
    if (dim != 0 && total > std::numeric_limits<std::uint64_t>::max() / dim) bad(f, "shape too large");
    total *= dim;
  }
  if (total > std::numeric_limits<std::uint64_t>::max() - h.data_offset_bytes) bad(f, "shape too large");
  const std::uint64_t size = f.size();
  if (size < h.data_offset_bytes + total) {
    bad(f, fmt::format("file of {} bytes is shorter than the {} bytes of data its header declares after byte {}", size,
                       total, h.data_offset_bytes));
  }
  return h;
}

batch_result gather_rows(const file_handle& f, const row_layout& layout, std::span<const std::int64_t> indices,
                         buffer_view out, const batch_options& options) {
  const std::string path = f.path().string();
  if (layout.row_bytes == 0 && !indices.empty()) {
    throw error(errno_code(EINVAL), "gather_rows", path, -1, 0, "rows of 0 bytes");
  }
  if (!indices.empty() && (indices.size() > std::numeric_limits<std::size_t>::max() / layout.row_bytes ||
                           out.nbytes < indices.size() * layout.row_bytes)) {
    throw error(errno_code(EINVAL), "gather_rows", path, -1, 0,
                fmt::format("the destination holds {} bytes; {} rows of {} bytes need more", out.nbytes, indices.size(),
                            layout.row_bytes));
  }
  // The last row must end within the largest file offset: a layout past it would wrap the offsets of its rows
  // around to the start of the file.
  constexpr std::uint64_t k_max_end = (std::uint64_t{1} << 63) - 1;  // as check_file_range: the last byte's end
  if (layout.nrows > 0 && layout.row_bytes > 0 &&
      (layout.data_offset_bytes > k_max_end || layout.nrows > (k_max_end - layout.data_offset_bytes) / layout.row_bytes)) {
    throw error(errno_code(EINVAL), "gather_rows", path, -1, 0,
                fmt::format("{} rows of {} bytes after byte {} end past the largest file offset (2^63 - 1)",
                            layout.nrows, layout.row_bytes, layout.data_offset_bytes));
  }
  std::vector<io_range> ranges;
  ranges.reserve(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t i = indices[k];
    if (i < 0 || static_cast<std::uint64_t>(i) >= layout.nrows) {
      throw error(errno_code(EINVAL), "gather_rows", path, -1, 0,
                  fmt::format("index {} at position {} is out of range for {} rows", i, k, layout.nrows));
    }
    const std::uint64_t offset = layout.data_offset_bytes + static_cast<std::uint64_t>(i) * layout.row_bytes;
    ranges.push_back({&f, offset, out.sub(k * layout.row_bytes, layout.row_bytes)});
  }
  batch_options o = options;
  o.exact = true;
  return transfer(io_direction::read, ranges, o);
}

}  // namespace gdskit
