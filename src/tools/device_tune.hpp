// `gdskit tune`: measures a device's O_DIRECT throughput over depth x request size, writing and reading a
// temporary file, and returns the profile (device_profile.hpp) the adaptive controller starts from.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <vector>

#include "engine/device_profile.hpp"

namespace gdskit::tools {

struct tune_options {
  std::filesystem::path dir = ".";                   ///< the temporary file goes here (and is removed)
  std::size_t file_bytes = std::size_t{512} << 20;   ///< bytes per measurement
  std::vector<unsigned> depths = {1, 2, 4, 8, 16, 32};
  std::vector<std::size_t> request_bytes = {std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{8} << 20,
                                            std::size_t{16} << 20};
  bool measure_write = true;
  /// Called after each point.
  std::function<void(const engine::profile_point&)> progress;
};

/// Runs the sweep. Throws gdskit::error when the folder refuses O_DIRECT, is full, or I/O fails; the temporary
/// file is removed in every case.
engine::device_profile tune_device(const tune_options& options);

}  // namespace gdskit::tools
