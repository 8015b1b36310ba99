// `gdskit tune --show` and `--forget`: what the profile folder holds (shapes `gdskit tune` measured and shapes
// loads and saves learned), and removing it, so that no state that changes later runs stays hidden.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "engine/device_profile.hpp"

namespace gdskit::tools {

/// The profile folder's files as `tune --show` prints them: per file its device, its shapes with their rates
/// and times, or why it is not used. `dir` is named at the top; an empty or missing folder says so.
std::string render_profiles(const std::filesystem::path& dir, const std::vector<engine::stored_profile>& files);
/// The same as one JSON document: {"folder", "profiles": [{"file", "kind", "device", "shapes", "ignored"}]}.
std::string profiles_json(const std::filesystem::path& dir, const std::vector<engine::stored_profile>& files);

/// Whether `file` is the profile of `device`: its block name ("nvme0n1"), its identity key, or the block name
/// in the file's name (for a file that cannot be read).
bool profile_matches(const engine::stored_profile& file, std::string_view device);

/// What `forget_profiles` did.
struct forget_result {
  std::vector<std::filesystem::path> removed;
  std::vector<std::string> failed;  ///< "<file>: <why>"
};

/// Removes the profile files of `files` that `device` matches (profile_matches), or all of them when `device` is
/// empty. Only files list_profiles() found are touched. Never throws.
forget_result forget_profiles(const std::vector<engine::stored_profile>& files, std::string_view device);

}  // namespace gdskit::tools
