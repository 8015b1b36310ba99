// Run-time settings: from code, the environment (GDSKIT_*) and defaults. Table with defaults: docs/settings.md.
//
// Precedence, strongest first: a value given in code (a settings object passed to a call, set_setting(),
// set_default_settings()) > the GDSKIT_* variable > a device's profile (tuned by `gdskit tune` or learned by
// earlier transfers; only the O_DIRECT depth and request sizes, per device, while transfers run) > the default.
// The process-wide settings are one object behind a lock: read a consistent copy with default_settings(),
// change them with set_setting() / set_default_settings(), from any thread; each value records its source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gdskit {

/// Whether files are opened with O_DIRECT. auto: used where the file system accepts it.
/// on: a file system that refuses O_DIRECT is an error. off: never.
enum class direct_mode { automatic, on, off };

/// Which engine submits host I/O. automatic: io_uring where the kernel allows it, else threads.
enum class engine_kind { automatic, io_uring, threads };

/// Which data path moves bytes between files and GPU memory (see path.hpp).
enum class path_mode { automatic, gds, staged, compat, host };

struct settings {
  /// Worker threads (and io_uring queue depth) for one large request. GDSKIT_THREADS.
  unsigned threads = 8;
  /// Requests in flight for O_DIRECT transfers (reads of data not in the page cache, and writes): storage
  /// wants depth, not every core. GDSKIT_DIRECT_DEPTH.
  unsigned direct_depth = 16;
  /// Large requests are split into tasks of this many bytes. GDSKIT_CHUNK_BYTES.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  /// Requests of at most this many bytes run inline on the calling thread. GDSKIT_INLINE_BYTES.
  std::size_t inline_bytes = std::size_t{1} << 20;
  /// GDSKIT_DIRECT=auto|on|off.
  direct_mode direct = direct_mode::automatic;
  /// GDSKIT_ENGINE=auto|io_uring|threads.
  engine_kind engine = engine_kind::automatic;
  /// GDSKIT_MODE=auto|gds|staged|compat|host.
  path_mode mode = path_mode::automatic;
  /// Pinned staging slots per worker of the staged GPU path (>= 2). GDSKIT_STAGING_SLOTS.
  unsigned staging_slots = 2;
  /// Size of one pinned staging slot when the bytes come from or go to storage (O_DIRECT).
  /// GDSKIT_STAGING_SLOT_BYTES.
  std::size_t staging_slot_bytes = std::size_t{8} << 20;
  /// Size of one pinned staging slot when a read's bytes come from the page cache (memory copies): smaller, so
  /// the slots a copy writes and the DMA reads stay in the CPU's last-level cache. GDSKIT_CACHED_SLOT_BYTES.
  std::size_t cached_slot_bytes = std::size_t{4} << 20;
  /// Whether O_DIRECT depth and request size adapt to the device while transfers run, starting from its
  /// profile (`gdskit tune`) where one exists. GDSKIT_ADAPTIVE=on|off (default on). Off: direct_depth and
  /// chunk_bytes / staging_slot_bytes are used as they are.
  bool adaptive = true;
  /// Whether the shape the controller converges to on a device is remembered in the profile folder (a learned
  /// profile, beside the one `gdskit tune` writes) so that later processes start from it and hold it until the
  /// device's rate moves. GDSKIT_LEARN=on|off (default on). Off: learned profiles are neither read nor written.
  bool learn = true;
  /// Whether small pieces between pinned staging and GPU memory (batches of many ranges) are moved by one copy
  /// kernel per group (on), or by the copy engines one piece at a time (off). GDSKIT_COPY_KERNEL=on|off
  /// (default on; copy engines are used anyway where the driver cannot load the kernel).
  bool copy_kernel = true;
  /// The largest piece the copy kernel moves when copy_kernel is on; larger pieces go to the copy engines, which
  /// cost the CPU some microseconds each but no GPU cores. GDSKIT_COPY_KERNEL_BYTES (4 KiB..64 MiB).
  std::size_t copy_kernel_bytes = std::size_t{64} << 10;
  /// Whether batches enter their staging memory in io_uring's table of registered buffers, so that a request
  /// through staging needs no pinning of its pages by the kernel (on), or pin per request as other reads do
  /// (off). GDSKIT_REGISTERED_STAGING=on|off (default on; where the kernel or the memory-lock limit refuses,
  /// requests go as with off).
  bool registered_staging = true;
  /// True when the matching GDSKIT_* variable was given (from_env) or code set the value on purpose: that value
  /// then wins over the adaptive controller and the profile, which adapt the other coordinate only. In the
  /// process-wide settings they follow the values' sources (set whenever the source is not the default).
  bool direct_depth_set = false;
  bool chunk_bytes_set = false;
  bool staging_slot_bytes_set = false;

  /// Defaults overridden by the GDSKIT_* variables that are set. Throws gdskit::error (EINVAL) naming the
  /// variable when a value cannot be parsed or is out of range.
  static settings from_env();
  /// Throws gdskit::error (EINVAL) when a field is out of range (threads and direct_depth 1..1024, chunk 4 KiB..1 GiB
  /// and a multiple of 4 KiB, staging_slots >= 2, both staging slot sizes 64 KiB..1 GiB and a multiple of 4 KiB,
  /// copy_kernel_bytes 4 KiB..64 MiB).
  void validate() const;
};

/// Where a value of the process-wide settings came from (see the precedence above).
enum class setting_source { defaults, environment, code };
std::string_view to_string(setting_source s) noexcept;

/// A consistent copy of the process-wide settings, read from the environment on first use (throws EINVAL
/// naming the variable when one is malformed). Thread-safe. Changes affect handles opened afterwards. Returned
/// const so that assigning to it (which would change nothing) does not compile: use set_setting().
const settings default_settings();

/// Sets one process-wide setting from text as its GDSKIT_* variable is read ("threads" "8", "chunk_bytes"
/// "4M", "direct" "off", "adaptive" "on"); its source becomes code. Thread-safe. Throws gdskit::error
/// (EINVAL) naming the setting for an unknown name, a malformed value or one out of range; nothing changes then.
void set_setting(std::string_view name, std::string_view value);
/// Gives one setting back to the environment, or to its default when its variable is not set.
void reset_setting(std::string_view name);
/// Replaces the process-wide settings (validated first: EINVAL, nothing changes). Values that differ from the
/// current ones, and direct_depth / chunk_bytes / staging_slot_bytes when their *_set flag is true, count as
/// set in code.
void set_default_settings(const settings& s);

/// How a setting's value reads: a whole number, a byte count, one word of a list, or on/off.
enum class setting_kind { count, bytes, choice, on_off };

/// One process-wide setting as it stands.
struct setting_entry {
  std::string name;      ///< the field's name ("threads")
  std::string variable;  ///< its GDSKIT_* variable
  setting_kind kind = setting_kind::count;
  std::string value;     ///< as text, in the form set_setting() takes ("8", "4194304", "auto", "on")
  setting_source source = setting_source::defaults;
  std::string help;      ///< one line: what it does, and its range or choices
  /// Empty, or what decides the value in use beyond this one: for the O_DIRECT depth and request sizes left at
  /// their defaults with adaptive on, a device's profile and the adaptive controller, per device.
  std::string note;
};
/// Every process-wide setting, in the order of docs/settings.md's table.
std::vector<setting_entry> describe_settings();

/// The process-wide settings and their sources, to put back later (scoped changes: Python's
/// `with gdskit.settings(...)`, tests).
struct settings_state {
  settings values;
  std::vector<setting_source> sources;
};
settings_state save_settings();
/// Puts back a saved state, values and sources. Thread-safe.
void restore_settings(const settings_state& state);

/// Parses a byte count: "4096", "4K", "4KiB", "8M", "1G", "1.5G" (binary units; "kB"/"MB"/"GB" are also binary,
/// like gdsio). Returns nullopt on garbage, a negative value, or overflow.
std::optional<std::uint64_t> parse_size(std::string_view text);
/// "1.50 GiB", "4.00 KiB", "17 B".
std::string format_size(std::uint64_t nbytes);

std::string_view to_string(direct_mode m) noexcept;
std::string_view to_string(engine_kind e) noexcept;
std::string_view to_string(path_mode m) noexcept;
std::optional<direct_mode> parse_direct_mode(std::string_view text) noexcept;
std::optional<engine_kind> parse_engine_kind(std::string_view text) noexcept;
std::optional<path_mode> parse_path_mode(std::string_view text) noexcept;

}  // namespace gdskit
