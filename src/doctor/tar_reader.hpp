// A streaming reader of the tar format that --capture writes (GNU tar's default format: ustar headers, GNU long
// names, pax extended headers), for reading captures back without trusting a listing printed by tar(1). It
// checks every header before a byte of its member is passed on, and accepts only what a capture holds:
// folders and regular files with relative names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace gdskit::doctor {

/// What a capture archive may hold at most. The defaults are the documented bounds of `doctor --root`.
struct tar_limits {
  std::size_t max_members = 100000;
  std::uint64_t max_total_bytes = 512ull << 20;  // sum of the regular files' sizes
  std::size_t max_name_bytes = 4096;             // a member's path
};

/// One member as the reader passes it on.
struct tar_member {
  std::string name;  // relative, normalised: no leading "./", no "." or ".." components, no trailing '/'
  bool directory = false;
  std::uint64_t size = 0;  // bytes of data that follow (0 for a folder)
};

/// Receives the members of an archive in order. An error returned by any call stops the reader with it.
class tar_sink {
 public:
  virtual ~tar_sink() = default;
  virtual std::error_code begin(const tar_member& m) = 0;
  /// The member's data, in pieces; the pieces add up to `size` before end() is called.
  virtual std::error_code data(std::string_view bytes) = 0;
  virtual std::error_code end() = 0;
};

/// Parses a tar stream fed in pieces of any size. Refuses (EINVAL, why() says what, in terms a user recognises)
/// headers whose checksum or magic is wrong, links, devices, FIFOs and sparse or multi-volume members, absolute
/// names, ".." components, names with control characters, and more members or bytes than `limits` allow; the
/// sizes checked are the ones the headers declare, and exactly that many bytes are passed on. Never throws.
class tar_reader {
 public:
  explicit tar_reader(tar_sink& sink, tar_limits limits = {}) : sink_(sink), limits_(limits) {}

  /// Feeds the next bytes of the stream. After an error every later call returns the same error.
  std::error_code feed(std::string_view bytes);
  /// Ends the stream: an error when it stopped inside a member or before any header.
  std::error_code finish();
  /// Whether the end-of-archive marker was read (bytes fed after it are ignored).
  bool done() const noexcept { return state_ == state::done; }
  /// The reason for the last error, for messages; empty when none.
  const std::string& why() const noexcept { return why_; }
  std::size_t members() const noexcept { return members_; }
  std::uint64_t total_bytes() const noexcept { return total_; }

 private:
  enum class state { header, data, padding, long_name, pax, skip, done, failed };
  std::error_code fail(std::string why);
  std::error_code sink_failed(std::error_code ec);
  std::error_code on_header();
  std::error_code on_extension_data_end();

  tar_sink& sink_;
  tar_limits limits_;
  state state_ = state::header;
  std::string block_;          // the header being assembled (512 bytes)
  std::string ext_;            // data of a GNU long name or pax header being assembled
  std::string pending_name_;   // a long name or pax path for the next member
  std::uint64_t pending_size_ = 0;
  bool has_pending_size_ = false;
  std::uint64_t left_ = 0;     // bytes left in the current member's data (or extension, or skipped data)
  std::uint64_t pad_ = 0;      // padding bytes left after the data
  bool in_member_ = false;     // data goes to the sink
  bool zero_block_seen_ = false;
  bool any_header_ = false;
  std::size_t members_ = 0;
  std::uint64_t total_ = 0;
  std::string why_;
  std::error_code error_;
};

/// Whether `name` (as found in an archive) is acceptable as a member of a capture, and its normalised form:
/// relative, no "..", no control characters, at most `max_bytes`. On refusal returns false and sets `why`.
bool normalise_member_name(std::string_view name, std::size_t max_bytes, std::string& out, std::string& why);

}  // namespace gdskit::doctor
