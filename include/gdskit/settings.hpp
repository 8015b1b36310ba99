// Run-time settings: from the environment (GDSKIT_*) and from code. Table with defaults: docs/settings.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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
  /// True when the matching GDSKIT_* variable was given (from_env) or code set the value on purpose: that value
  /// then wins over the adaptive controller and the profile, which adapt the other coordinate only.
  bool direct_depth_set = false;
  bool chunk_bytes_set = false;
  bool staging_slot_bytes_set = false;

  /// Defaults overridden by the GDSKIT_* variables that are set. Throws gdskit::error (EINVAL) naming the
  /// variable when a value cannot be parsed or is out of range.
  static settings from_env();
  /// Throws gdskit::error (EINVAL) when a field is out of range (threads and direct_depth 1..1024, chunk 4 KiB..1 GiB
  /// and a multiple of 4 KiB, staging_slots >= 2, both staging slot sizes 64 KiB..1 GiB and a multiple of 4 KiB).
  void validate() const;
};

/// The process-wide settings, read from the environment on first use. Changing them affects handles opened
/// afterwards. Not synchronised: set them before starting I/O from several threads.
settings& default_settings();

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
