// Device profiles: the measured best O_DIRECT shape of a block device (written by `gdskit tune`), the adaptive
// controller's starting point. Stored as JSON under $XDG_CACHE_HOME/gdskit/ (default ~/.cache/gdskit/), one
// file per device identity. A file that is not a small regular file, does not parse, has another version or
// device identity, or holds absurd values is ignored, with the reason.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
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

/// $XDG_CACHE_HOME/gdskit, else $HOME/.cache/gdskit; empty when neither variable is usable.
std::filesystem::path profile_dir();
/// The file of a device's profile inside `dir`.
std::filesystem::path profile_path(const std::filesystem::path& dir, const device_identity& id);

/// A profile, or why none is used.
struct profile_result {
  std::optional<device_profile> profile;
  std::string reason;  ///< why not (empty when a profile was loaded)
};

/// Reads and checks `file` as the profile of `id`. Never throws.
profile_result load_profile(const std::filesystem::path& file, const device_identity& id);

/// JSON text of a profile.
std::string profile_json(const device_profile& p);
/// Writes the profile atomically (temp file + rename) into `dir` (created). Throws gdskit::error.
std::filesystem::path save_profile(const std::filesystem::path& dir, const device_profile& p);

/// The profile for device `dev` of this process (looked up once per device in profile_dir(); cached).
const profile_result& profile_for_device(dev_t dev);

}  // namespace gdskit::engine
