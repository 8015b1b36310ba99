// Device profiles: the measured best O_DIRECT shape of a block device (written by `gdskit tune`), the adaptive
// controller's starting point. Stored as JSON under $XDG_CACHE_HOME/gdskit/ (default ~/.cache/gdskit/), one
// file per device identity. A file that is not a small regular file, does not parse, has another version or
// device identity, or holds absurd values is ignored, with the reason.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/adaptive.hpp"

namespace gdskit::engine {

/// Who a device is, as stably as sysfs can tell: WWN, else model + serial, else major:minor.
struct device_identity {
  std::string block;  ///< whole-disk name, "nvme0n1"; "" when the file is not on a block device
  std::string key;    ///< "wwid=...", "model=... serial=...", or "dev=259:0"
};

/// The identity of the block device holding `dev` (st_dev) under `root` (/ live, a captured folder in tests).
device_identity identify_device(const std::filesystem::path& root, dev_t dev);

struct profile_point {
  io_dir dir = io_dir::read;
  io_shape shape;
  double gib_per_s = 0;
};

struct device_profile {
  static constexpr int k_version = 1;
  device_identity device;
  io_shape read;
  io_shape write;
  double read_gib_per_s = 0;
  double write_gib_per_s = 0;
  std::string created;                ///< ISO 8601 UTC
  std::vector<profile_point> sweep;   ///< every measured point (informational)
};

/// Profile files larger than this are not read.
inline constexpr std::size_t k_profile_max_bytes = std::size_t{1} << 20;
/// Profile files nested deeper than this are not read (the format needs 3: "shapes" -> key -> shape).
inline constexpr std::size_t k_profile_max_json_depth = 8;

// The bounds a shape read from a file (tuned or learned) is held to before it starts a transfer, by client
// (docs/settings.md, "Device profiles"). Each lane of the staged path pins staging slots and takes a worker, so
// its depth bounds pinned memory and threads; the host engine's depth is io_uring entries or worker threads.
inline constexpr unsigned k_staged_max_depth = 16;
inline constexpr unsigned k_host_max_depth = 64;
/// The host engine's and the cuFile path's largest request (the staged path's is its slot size).
inline constexpr std::size_t k_host_max_request_bytes = std::size_t{16} << 20;

/// `shape` held to `limits` (those of the client it is to start): depth within min_depth..max_depth, request
/// size within min_request_bytes..max_request_bytes. `note` says what was cut ("depth 1024 held to 16,
/// 512.00 MiB held to 16.00 MiB"), or is empty when nothing was.
io_shape clamp_to_limits(io_shape shape, const adaptive_limits& limits, std::string& note);

/// $XDG_CACHE_HOME/gdskit, else $HOME/.cache/gdskit; empty when neither variable is usable.
std::filesystem::path profile_dir();
/// The file of a device's profile inside `dir`.
std::filesystem::path profile_path(const std::filesystem::path& dir, const device_identity& id);

/// A profile, or why none is used.
struct profile_result {
  std::optional<device_profile> profile;
  std::string reason;  ///< why not (empty when a profile was loaded)
};

/// Reads and checks `file` as the profile of `id`: a regular file (not a link) of at most k_profile_max_bytes,
/// owned by this process's user and not writable by group or others, whose text parse_profile() accepts.
/// Never throws.
profile_result load_profile(const std::filesystem::path& file, const device_identity& id);
/// Checks the text of a profile file made for `id`: JSON nested at most k_profile_max_json_depth deep, this
/// version and device identity, depths in 1..1024 and request sizes that are multiples of 4 KiB in
/// 4 KiB..1 GiB (a client holds them to its own bounds when it starts: clamp_to_limits). Never throws.
profile_result parse_profile(std::string_view text, const device_identity& id);

/// JSON text of a profile.
std::string profile_json(const device_profile& p);
/// Writes the profile atomically (temp file + rename) into `dir` (created). Throws gdskit::error.
std::filesystem::path save_profile(const std::filesystem::path& dir, const device_profile& p);

/// The profile for device `dev` of this process (looked up once per device in profile_dir(); cached).
const profile_result& profile_for_device(dev_t dev);

/// "2026-12-01T13:20:11Z".
std::string utc_now_iso();

// Learned profiles: the shapes the adaptive controller converged to on a device, written by the library itself
// (learned-<device>-<hash>.json beside the profile) so that the next process starts where the last one ended,
// as TCP keeps a route's metrics. A tuned profile wins over them. Same checks as a tuned profile on reading.

/// One converged shape and the rate it held.
struct learned_shape {
  io_shape shape;
  double gib_per_s = 0;
  std::string updated;  ///< ISO 8601 UTC
};

struct learned_profile {
  /// 2: shapes learned with smaller request sizes held to a clear win (adaptive_limits::smaller_request_gain);
  /// a version-1 file may hold a request size that won on a tie, and is ignored and learned again.
  static constexpr int k_version = 2;
  device_identity device;
  std::map<std::string, learned_shape> shapes;  ///< by learned_key()
};

/// "staged-read", "host-write", ...: which client and direction a learned shape is for.
std::string learned_key(io_dir dir, bool staged);

struct learned_result {
  std::optional<learned_profile> learned;
  std::string reason;  ///< why none is used (empty when one was loaded)
};

std::filesystem::path learned_path(const std::filesystem::path& dir, const device_identity& id);
/// Reads and checks `file` as the learned profile of `id` (the file checks of load_profile); entries under
/// unknown keys are dropped. Never throws.
learned_result load_learned(const std::filesystem::path& file, const device_identity& id);
/// Checks the text of a learned profile made for `id`, as parse_profile() does. Never throws.
learned_result parse_learned(std::string_view text, const device_identity& id);
std::string learned_json(const learned_profile& p);
/// Writes atomically into `dir` (created). Throws gdskit::error.
std::filesystem::path save_learned(const std::filesystem::path& dir, const learned_profile& p);

/// The learned shape for `key` on device `dev`, as this process knows it (the file is read once per device);
/// `device_name`, when given, gets the device's block name (its identity key when it has none).
std::optional<learned_shape> learned_for_device(dev_t dev, const std::string& key, std::string* device_name = nullptr);
/// The whole learned profile of `dev` (for doctor).
learned_result learned_profile_for_device(dev_t dev);
/// Records `shape` for `key` on `dev`: merged into the device's learned file (re-read first, so shapes other
/// processes wrote are kept) and into this process's copy. False when it could not be written. Never throws.
bool remember_learned(dev_t dev, const std::string& key, learned_shape shape) noexcept;

/// One learned shape this process wrote (remember_learned), for the line a command prints about it.
struct learned_write {
  std::string device;  ///< the device's block name, else its identity key
  std::string key;     ///< learned_key()
  io_shape shape;
};
/// The learned shapes written since the last call, oldest first (the last 64). Thread-safe, never throws.
std::vector<learned_write> take_learned_writes() noexcept;
/// One line that says what was learned and how to drop it: "learned: host reads depth 8 x 1.00 MiB on nvme0n1
/// (gdskit tune --forget nvme0n1 drops it)". Device names are escaped. Empty when `writes` is.
std::string learned_notice(const std::vector<learned_write>& writes);
/// learned_notice(take_learned_writes()): what a command prints after its transfers (empty: nothing written).
std::string take_learned_notice();

// The profile folder as `gdskit tune --show` and `--forget` see it.

/// One profile file of the folder: a tuned profile (profile-*.json) or learned shapes (learned-*.json).
struct stored_profile {
  std::filesystem::path file;
  bool learned = false;
  device_identity device;                ///< as the file names it (escaped); empty when unreadable
  std::optional<device_profile> tuned;   ///< a usable tuned profile
  std::optional<learned_profile> shapes; ///< usable learned shapes
  std::string reason;                    ///< why the file is not used (empty when it is)
};

/// Every profile-*.json and learned-*.json file in `dir`, sorted by file name, each checked as load_profile()
/// and load_learned() check it (against the device the file itself names). Nothing when `dir` does not exist.
/// Never throws.
std::vector<stored_profile> list_profiles(const std::filesystem::path& dir);

}  // namespace gdskit::engine
