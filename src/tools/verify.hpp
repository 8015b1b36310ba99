// gdskit verify: fill memory with a pattern, write it to a file through the chosen path, clear the memory,
// read it back, and compare every byte.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gdskit/path.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::tools {

struct verify_options {
  std::filesystem::path file;   ///< created (exclusive) and removed afterwards unless keep_file
  std::vector<std::uint64_t> sizes;
  int device = 0;               ///< -1: host memory
  std::uint64_t seed = 1;
  std::uint64_t file_offset = 0;  ///< where in the file the data goes (unaligned offsets are allowed)
  bool keep_file = false;
  settings config;
  /// Called with the bytes of each finished write and each finished read-back (progress: 2 x the sum of sizes).
  std::function<void(std::uint64_t nbytes)> on_bytes;
};

struct verify_result {
  std::uint64_t nbytes = 0;
  path_decision path;           ///< the planner's path for this buffer
  double write_gib_s = 0;
  double read_gib_s = 0;
  bool ok = false;
  std::int64_t first_mismatch = -1;  ///< byte offset of the first difference, -1 if none
  std::string error;            ///< a failure that stopped this size (empty when none)
};

/// The byte at `index` of the pattern for `seed` (splitmix64 per 8-byte word): reproducible piecewise.
void fill_pattern(std::uint64_t seed, std::uint64_t first_index, std::uint8_t* out, std::size_t n);

/// Runs every size; calls `on_result` after each. Throws gdskit::error only for setup failures (the file
/// cannot be created, no memory); transfer failures are reported per size.
std::vector<verify_result> run_verify(const verify_options& options,
                                      const std::function<void(const verify_result&)>& on_result = {});

}  // namespace gdskit::tools
