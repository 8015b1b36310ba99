#include "doctor/tar_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace gdskit::doctor {
namespace {

constexpr std::size_t block_bytes = 512;
// A pax header is a handful of "len key=value" records; a capture never needs more.
constexpr std::uint64_t max_pax_bytes = 64 * 1024;

std::string_view field(const std::string& b, std::size_t off, std::size_t len) {
  std::string_view f(b.data() + off, len);
  auto nul = f.find('\0');
  return nul == std::string_view::npos ? f : f.substr(0, nul);
}

// An octal header number ("0000644\0", " 12 "), or base-256 (first byte 0x80) as GNU tar writes large sizes.
// nullopt when the field is neither, negative, or above `max`.
std::optional<std::uint64_t> header_number(const std::string& b, std::size_t off, std::size_t len, std::uint64_t max) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + off);
  std::uint64_t v = 0;
  if (p[0] & 0x80) {
    if (p[0] & 0x40) return std::nullopt;  // negative
    v = p[0] & 0x3f;
    for (std::size_t i = 1; i < len; ++i) {
      if (v > (max >> 8)) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v <= max ? std::optional<std::uint64_t>(v) : std::nullopt;
  }
  std::size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  bool digits = false;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v > (max >> 3)) return std::nullopt;
    v = (v << 3) | (p[i] - '0');
    digits = true;
  }
  for (; i < len; ++i)
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  if (!digits || v > max) return std::nullopt;
  return v;
}

bool all_zero(const std::string& b) {
  return std::all_of(b.begin(), b.end(), [](char c) { return c == '\0'; });
}

}  // namespace

bool normalise_member_name(std::string_view name, std::size_t max_bytes, std::string& out, std::string& why) {
  out.clear();
  if (name.size() > max_bytes) {
    why = fmt::format("a member name longer than {} bytes", max_bytes);
    return false;
  }
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      why = "a member name with control characters";
      return false;
    }
  }
  if (!name.empty() && name.front() == '/') {
    why = "a member with an absolute path";
    return false;
  }
  std::size_t i = 0;
  while (i <= name.size()) {
    auto j = name.find('/', i);
    if (j == std::string_view::npos) j = name.size();
    const std::string_view part = name.substr(i, j - i);
    if (part == "..") {
      why = "a member whose path climbs out of the capture (\"..\")";
      return false;
    }
    if (!part.empty() && part != ".") {
      if (!out.empty()) out += '/';
      out += part;
    }
    i = j + 1;
  }
  return true;
}

std::error_code tar_reader::fail(std::string why) {
  why_ = std::move(why);
  error_ = std::make_error_code(std::errc::invalid_argument);
  state_ = state::failed;
  return error_;
}

std::error_code tar_reader::sink_failed(std::error_code ec) {
  if (why_.empty()) why_ = "could not be unpacked";
  error_ = ec;
  state_ = state::failed;
  return ec;
}

std::error_code tar_reader::on_header() {
  if (all_zero(block_)) {
    if (zero_block_seen_) state_ = state::done;
    zero_block_seen_ = true;
    return {};
  }
  if (zero_block_seen_) return fail("damaged: data after an empty block");
  // The checksum covers the header with its own field read as spaces.
  unsigned sum = 0;
  for (std::size_t i = 0; i < block_bytes; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(block_[i]);
  const auto stored = header_number(block_, 148, 8, 0777777);
  if (!stored || *stored != sum) return fail(any_header_ ? "damaged: a header checksum is wrong" : "not a tar archive");
  const std::string_view magic(block_.data() + 257, 8);
  const bool posix = magic.substr(0, 6) == std::string_view("ustar\0", 6);
  const bool gnu = magic == std::string_view("ustar  \0", 8);
  if (!posix && !gnu) return fail("not a capture archive (a tar format other than ustar or GNU)");
  any_header_ = true;

  const char type = block_[156];
  const auto size = header_number(block_, 124, 12, ~std::uint64_t{0} >> 1);
  if (!size) return fail("damaged: a member size is not a number");
  if (type == 'L' || type == 'x') {
    const std::uint64_t cap = type == 'L' ? limits_.max_name_bytes + 1 : max_pax_bytes;
    if (*size > cap) return fail(type == 'L' ? fmt::format("a member name longer than {} bytes", limits_.max_name_bytes)
                                             : "an extended header larger than 64 KiB");
    ext_.clear();
    left_ = *size;
    state_ = type == 'L' ? state::long_name : state::pax;
  } else if (type == 'g') {
    if (*size > max_pax_bytes) return fail("an extended header larger than 64 KiB");
    left_ = *size;
    state_ = state::skip;
  } else if (type == '0' || type == '\0' || type == '5') {
    std::string raw = pending_name_;
    if (raw.empty()) {
      raw = std::string(field(block_, 0, 100));
      const std::string_view prefix = posix ? field(block_, 345, 155) : std::string_view();
      if (!prefix.empty()) raw = std::string(prefix) + "/" + raw;
    }
    std::uint64_t bytes = has_pending_size_ ? pending_size_ : *size;
    pending_name_.clear();
    has_pending_size_ = false;
    tar_member m;
    m.directory = type == '5' || (!raw.empty() && raw.back() == '/' && type != '0');
    std::string why;
    if (!normalise_member_name(raw, limits_.max_name_bytes, m.name, why)) return fail(why);
    if (members_ >= limits_.max_members) return fail(fmt::format("more than {} members", limits_.max_members));
    ++members_;
    if (m.directory) bytes = 0;
    if (bytes > limits_.max_total_bytes - std::min(total_, limits_.max_total_bytes))
      return fail(fmt::format("unpacks to more than {} MiB", limits_.max_total_bytes >> 20));
    total_ += bytes;
    m.size = bytes;
    if (m.name.empty()) {
      // The archive's top folder ("./"): nothing to create.
      if (!m.directory) return fail("a file member without a name");
      in_member_ = false;
    } else {
      if (auto ec = sink_.begin(m)) return sink_failed(ec);
      in_member_ = true;
    }
    left_ = bytes;
    // A folder's header may still declare data (it never should): it is skipped like padding.
    const std::uint64_t declared = m.directory ? *size : bytes;
    pad_ = (m.directory ? declared : 0) + (block_bytes - declared % block_bytes) % block_bytes;
    state_ = state::data;
  } else if (type == '1' || type == '2' || type == 'K') {
    return fail("holds a link");
  } else {
    return fail(fmt::format("holds a special file (tar type '{}')",
                            type >= 0x20 && type < 0x7f ? std::string(1, type) : fmt::format("\\x{:02x}", type & 0xff)));
  }
  if (state_ != state::data) pad_ = (block_bytes - *size % block_bytes) % block_bytes;
  if (state_ == state::data && left_ == 0) {
    if (in_member_) {
      in_member_ = false;
      if (auto ec = sink_.end()) return sink_failed(ec);
    }
    state_ = pad_ > 0 ? state::padding : state::header;
  }
  return {};
}

std::error_code tar_reader::on_extension_data_end() {
  if (state_ == state::long_name) {
    auto nul = ext_.find('\0');
    pending_name_ = ext_.substr(0, nul);
    if (pending_name_.empty()) return fail("damaged: an empty long name");
  } else if (state_ == state::pax) {
    // Records "LEN key=value\n", LEN counting the whole record.
    std::size_t pos = 0;
    while (pos < ext_.size()) {
      std::size_t sp = ext_.find(' ', pos);
      if (sp == std::string::npos) return fail("damaged: an extended header record");
      std::uint64_t len = 0;
      for (std::size_t i = pos; i < sp; ++i) {
        if (ext_[i] < '0' || ext_[i] > '9' || len > ext_.size()) return fail("damaged: an extended header record");
        len = len * 10 + static_cast<std::uint64_t>(ext_[i] - '0');
      }
      if (len <= sp - pos + 1 || pos + len > ext_.size() || ext_[pos + len - 1] != '\n')
        return fail("damaged: an extended header record");
      const std::string rec = ext_.substr(sp + 1, pos + len - 1 - (sp + 1));
      const auto eq = rec.find('=');
      if (eq == std::string::npos) return fail("damaged: an extended header record");
      const std::string key = rec.substr(0, eq), value = rec.substr(eq + 1);
      if (key == "path") {
        if (value.empty() || value.size() > limits_.max_name_bytes)
          return fail(fmt::format("a member name longer than {} bytes", limits_.max_name_bytes));
        pending_name_ = value;
      } else if (key == "size") {
        std::uint64_t v = 0;
        if (value.empty() || value.size() > 19) return fail("damaged: a member size is not a number");
        for (char c : value) {
          if (c < '0' || c > '9') return fail("damaged: a member size is not a number");
          v = v * 10 + static_cast<std::uint64_t>(c - '0');
        }
        pending_size_ = v;
        has_pending_size_ = true;
      }
      pos += len;
    }
  }
  ext_.clear();
  state_ = pad_ > 0 ? state::padding : state::header;
  return {};
}

std::error_code tar_reader::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    switch (state_) {
      case state::failed: return error_;
      case state::done: return {};
      case state::header: {
        const std::size_t take = std::min(bytes.size(), block_bytes - block_.size());
        block_.append(bytes.data(), take);
        bytes.remove_prefix(take);
        if (block_.size() == block_bytes) {
          auto ec = on_header();
          block_.clear();
          if (ec) return ec;
        }
        break;
      }
      case state::data:
      case state::long_name:
      case state::pax:
      case state::skip: {
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), left_));
        const std::string_view piece = bytes.substr(0, take);
        bytes.remove_prefix(take);
        left_ -= take;
        if (state_ == state::data) {
          if (in_member_ && take > 0) {
            if (auto ec = sink_.data(piece)) return sink_failed(ec);
          }
          if (left_ == 0) {
            if (in_member_) {
              in_member_ = false;
              if (auto ec = sink_.end()) return sink_failed(ec);
            }
            state_ = pad_ > 0 ? state::padding : state::header;
          }
        } else if (state_ == state::skip) {
          if (left_ == 0) state_ = pad_ > 0 ? state::padding : state::header;
        } else {
          ext_.append(piece);
          if (left_ == 0) {
            if (auto ec = on_extension_data_end()) return ec;
          }
        }
        break;
      }
      case state::padding: {
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), pad_));
        bytes.remove_prefix(take);
        pad_ -= take;
        if (pad_ == 0) state_ = state::header;
        break;
      }
    }
  }
  return state_ == state::failed ? error_ : std::error_code{};
}

std::error_code tar_reader::finish() {
  if (state_ == state::failed) return error_;
  if (state_ == state::done) return {};
  if (!any_header_) return fail(block_.empty() && !zero_block_seen_ ? "empty: not a tar archive" : "not a tar archive");
  // One end block then the end of the stream is how some writers stop; anything else was cut short.
  if (state_ == state::header && block_.empty() && zero_block_seen_) {
    state_ = state::done;
    return {};
  }
  return fail("ends early (truncated)");
}

}  // namespace gdskit::doctor
