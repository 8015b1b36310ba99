// What `gdskit tune --show` lists and `--forget` removes: every tuned and learned profile file of the profile
// folder, per device, bad ones with the reason; a device's files removed by its name, nothing else touched.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "engine/device_profile.hpp"
#include "test_support.hpp"
#include "tools/profile_store.hpp"

namespace gdskit::tools {
namespace {

using engine::device_identity;
using test::temp_dir;
namespace fs = std::filesystem;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// A folder with nvme0n1's tuned and learned profiles, vda's learned one, a damaged file and a stranger.
fs::path filled(const temp_dir& t) {
  const fs::path dir = t.path() / "gdskit";
  const device_identity nvme{"nvme0n1", "wwid=eui.1234"};
  const device_identity vda{"vda", "dev=254:0 vda"};
  engine::device_profile p;
  p.device = nvme;
  p.read = {8, 4 * kMiB};
  p.write = {4, 8 * kMiB};
  p.read_gib_per_s = 6.5;
  p.write_gib_per_s = 3.25;
  p.created = "2026-12-01T13:20:11Z";
  engine::save_profile(dir, p);
  engine::learned_profile l;
  l.device = nvme;
  l.shapes["host-read"] = {{16, kMiB}, 5.5, "2026-12-02T08:00:00Z"};
  engine::save_learned(dir, l);
  l.device = vda;
  l.shapes.clear();
  l.shapes["staged-write"] = {{2, 8 * kMiB}, 1.5, "2026-12-03T09:30:00Z"};
  engine::save_learned(dir, l);
  test::write_text(dir / "learned-sdb-0000000000000001.json", "{\"version\": 1}");
  ::chmod((dir / "learned-sdb-0000000000000001.json").c_str(), 0644);
  test::write_text(dir / "notes.txt", "not a profile\n");
  return dir;
}

TEST(profile_store, lists_every_profile_file_per_device_with_its_shapes) {
  temp_dir t;
  const fs::path dir = filled(t);
  const auto files = engine::list_profiles(dir);
  ASSERT_EQ(files.size(), 4u);  // notes.txt is not a profile file
  const std::string text = render_profiles(dir, files);
  EXPECT_NE(text.find("profile folder: " + dir.string()), std::string::npos) << text;
  EXPECT_NE(text.find("nvme0n1 (wwid=eui.1234)"), std::string::npos) << text;
  EXPECT_NE(text.find("tuned    reads          depth  8 x 4.00 MiB      6.50 GiB/s  2026-12-01T13:20:11Z"),
            std::string::npos) << text;
  EXPECT_NE(text.find("learned  host reads     depth 16 x 1.00 MiB      5.50 GiB/s  2026-12-02T08:00:00Z"),
            std::string::npos) << text;
  EXPECT_NE(text.find("learned  staged writes  depth  2 x 8.00 MiB"), std::string::npos) << text;
  // The damaged file is listed with why it is not used, under the name its file gives.
  EXPECT_NE(text.find("not used: learned profile ignored: version is not 2"), std::string::npos) << text;
  EXPECT_NE(text.find("gdskit tune --forget DEVICE"), std::string::npos) << text;

  const auto j = nlohmann::json::parse(profiles_json(dir, files));
  EXPECT_EQ(j["folder"], dir.string());
  ASSERT_EQ(j["profiles"].size(), 4u);
  std::size_t tuned = 0, ignored = 0;
  for (const auto& p : j["profiles"]) {
    EXPECT_TRUE(fs::exists(p["file"].get<std::string>()));
    if (p["kind"] == "tuned") {
      ++tuned;
      EXPECT_EQ(p["device"]["block"], "nvme0n1");
      ASSERT_EQ(p["shapes"].size(), 2u);
      EXPECT_EQ(p["shapes"][1]["name"], "writes");
      EXPECT_EQ(p["shapes"][1]["request_bytes"], 8 * kMiB);
    }
    if (!p["ignored"].is_null()) ++ignored;
  }
  EXPECT_EQ(tuned, 1u);
  EXPECT_EQ(ignored, 1u);
}

TEST(profile_store, an_empty_folder_says_nothing_is_learned) {
  temp_dir t;
  EXPECT_TRUE(engine::list_profiles(t.path() / "missing").empty());
  const std::string text = render_profiles(t.path() / "missing", {});
  EXPECT_NE(text.find("nothing learned or tuned"), std::string::npos) << text;
}

TEST(profile_store, forget_removes_one_devices_files_or_all_and_nothing_else) {
  temp_dir t;
  const fs::path dir = filled(t);
  auto r = forget_profiles(engine::list_profiles(dir), "nvme0n1");
  EXPECT_EQ(r.removed.size(), 2u);  // its tuned and learned files
  EXPECT_TRUE(r.failed.empty());
  EXPECT_EQ(engine::list_profiles(dir).size(), 2u);
  // Nothing of that device left: nothing removed, no error.
  r = forget_profiles(engine::list_profiles(dir), "nvme0n1");
  EXPECT_TRUE(r.removed.empty() && r.failed.empty());
  // By identity key, and by the name in the file's name for a file that cannot be read.
  EXPECT_EQ(forget_profiles(engine::list_profiles(dir), "dev=254:0 vda").removed.size(), 1u);
  EXPECT_EQ(forget_profiles(engine::list_profiles(dir), "sdb").removed.size(), 1u);
  EXPECT_TRUE(engine::list_profiles(dir).empty());
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));

  const fs::path again = filled(t);
  r = forget_profiles(engine::list_profiles(again), "");
  EXPECT_EQ(r.removed.size(), 4u);
  EXPECT_TRUE(fs::exists(again / "notes.txt")) << "--all removes profile files only";
}

// A device name written into a file is shown escaped: it cannot drive the terminal that lists it.
TEST(profile_store, names_from_files_are_escaped) {
  temp_dir t;
  const fs::path dir = t.path() / "gdskit";
  engine::learned_profile l;
  l.device = {"evil\x1b[31m", "wwid=x\ny"};
  l.shapes["host-read"] = {{4, kMiB}, 1.0, ""};
  engine::save_learned(dir, l);
  const std::string text = render_profiles(dir, engine::list_profiles(dir));
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("evil\\x1b[31m"), std::string::npos) << text;
  EXPECT_NE(text.find("wwid=x\\ny"), std::string::npos) << text;
}

}  // namespace
}  // namespace gdskit::tools
