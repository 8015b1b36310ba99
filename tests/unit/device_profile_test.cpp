// Device identity from a captured sysfs, profile round trips, and every kind of bad or stale profile file
// ignored with a reason.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>


#include <nlohmann/json.hpp>

#include "engine/device_profile.hpp"
#include "test_support.hpp"

namespace gdskit::engine {
namespace {

using test::temp_dir;
namespace fs = std::filesystem;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// sys/block/sda -> devices/.../sda, sys/dev/block/8:1 -> its partition, as on a live system.
fs::path fake_root(const temp_dir& t, bool with_wwid, bool with_serial) {
  const fs::path root = t.path() / "root";
  const fs::path disk = root / "sys/devices/pci0000:00/block/sda";
  test::write_text(disk / "sda1/partition", "1\n");
  test::write_text(disk / "dev", "8:0\n");
  if (with_wwid) test::write_text(disk / "wwid", "naa.5000c500a1b2c3d4\n");
  test::write_text(disk / "device/model", "Fast SSD \x1b[31m 1TB  \n");
  if (with_serial) test::write_text(disk / "device/serial", "S123\n");
  fs::create_directories(root / "sys/dev/block");
  fs::create_directories(root / "sys/block");
  fs::create_directory_symlink("../../devices/pci0000:00/block/sda/sda1", root / "sys/dev/block/8:1");
  fs::create_directory_symlink("../../devices/pci0000:00/block/sda", root / "sys/dev/block/8:0");
  fs::create_directory_symlink("../devices/pci0000:00/block/sda", root / "sys/block/sda");
  return root;
}

device_profile sample(const device_identity& id) {
  device_profile p;
  p.device = id;
  p.read = {32, 4 * kMiB};
  p.write = {8, 8 * kMiB};
  p.read_gib_per_s = 6.5;
  p.write_gib_per_s = 3.1;
  p.created = "2026-12-01T09:00:00Z";
  p.sweep.push_back({io_dir::read, {1, kMiB}, 1.2});
  return p;
}

TEST(device_profile, identity_prefers_wwid_then_model_and_serial_then_numbers) {
  {
    temp_dir t;
    auto id = identify_device(fake_root(t, true, true), makedev(8, 1));
    EXPECT_EQ(id.block, "sda");
    EXPECT_EQ(id.key, "wwid=naa.5000c500a1b2c3d4");
  }
  {
    temp_dir t;
    auto id = identify_device(fake_root(t, false, true), makedev(8, 1));
    EXPECT_EQ(id.block, "sda");
    // Control characters from sysfs never reach the key.
    EXPECT_EQ(id.key, "model=Fast SSD [31m 1TB serial=S123");
  }
  {
    temp_dir t;
    auto id = identify_device(fake_root(t, false, false), makedev(8, 1));
    EXPECT_EQ(id.key, "dev=8:1 sda");
  }
  temp_dir t;
  EXPECT_EQ(identify_device(t.path(), makedev(0, 42)).key, "dev=0:42");
}

TEST(device_profile, identity_never_reads_through_links_that_leave_the_root) {
  const std::string marker = "MARKER-OUTSIDE-THE-ROOT";
  temp_dir t;
  const fs::path root = fake_root(t, false, false);
  test::write_text(t.path() / "outside/wwid", marker + "\n");
  test::write_text(t.path() / "outside/serial", marker + "\n");
  const fs::path disk = root / "sys/devices/pci0000:00/block/sda";
  fs::create_symlink(t.path() / "outside/wwid", disk / "wwid");
  fs::create_symlink("../../../../../../../outside/serial", disk / "device/serial");
  auto id = identify_device(root, makedev(8, 1));
  EXPECT_EQ(id.block, "sda");
  EXPECT_EQ(id.key.find(marker), std::string::npos) << id.key;
  EXPECT_EQ(id.key, "dev=8:1 sda");
  // A device link that leaves the root names no disk.
  fs::remove(root / "sys/dev/block/8:1");
  fs::create_directory_symlink(t.path() / "outside", root / "sys/dev/block/8:1");
  EXPECT_EQ(identify_device(root, makedev(8, 1)).block, "");
}

TEST(device_profile, saved_profile_loads_back) {
  temp_dir t;
  device_identity id{"nvme0n1", "wwid=eui.1234"};
  const fs::path file = save_profile(t.path() / "cache/gdskit", sample(id));
  EXPECT_EQ(file, profile_path(t.path() / "cache/gdskit", id));
  auto r = load_profile(file, id);
  ASSERT_TRUE(r.profile) << r.reason;
  EXPECT_EQ(r.profile->read, (io_shape{32, 4 * kMiB}));
  EXPECT_EQ(r.profile->write, (io_shape{8, 8 * kMiB}));
  EXPECT_DOUBLE_EQ(r.profile->read_gib_per_s, 6.5);
  EXPECT_TRUE(r.reason.empty());
}

TEST(device_profile, profile_dir_follows_xdg_then_home) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(profile_dir(), fs::path("/x/cache/gdskit"));
  ::setenv("XDG_CACHE_HOME", "relative", 1);  // not absolute: ignored, as the XDG spec says
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') EXPECT_EQ(profile_dir(), fs::path(home) / ".cache/gdskit");
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1); else ::unsetenv("XDG_CACHE_HOME");
}

TEST(device_profile, bad_or_stale_files_are_ignored_with_a_reason) {
  temp_dir t;
  device_identity id{"nvme0n1", "wwid=eui.1234"};
  nlohmann::json good = nlohmann::json::parse(profile_json(sample(id)));
  auto edit = [&](auto f) {
    nlohmann::json j = good;
    f(j);
    return j.dump();
  };
  const std::vector<std::pair<const char*, std::string>> bad = {
      {"unparsable", "{\"version\": 1, \"device\": "},
      {"not an object", "[1, 2, 3]"},
      {"wrong version", edit([](auto& j) { j["version"] = 2; })},
      {"version as text", edit([](auto& j) { j["version"] = "1"; })},
      {"another device", edit([](auto& j) { j["device"]["key"] = "wwid=eui.9999"; })},
      {"no device", edit([](auto& j) { j.erase("device"); })},
      {"depth zero", edit([](auto& j) { j["read"]["depth"] = 0; })},
      {"depth absurd", edit([](auto& j) { j["write"]["depth"] = 100000; })},
      {"negative depth", edit([](auto& j) { j["read"]["depth"] = -4; })},
      {"request not aligned", edit([](auto& j) { j["read"]["request_bytes"] = 4097; })},
      {"request absurd", edit([](auto& j) { j["read"]["request_bytes"] = std::uint64_t{1} << 40; })},
      {"request missing", edit([](auto& j) { j["write"].erase("request_bytes"); })},
      {"no read shape", edit([](auto& j) { j.erase("read"); })},
      {"too large", good.dump() + std::string(k_profile_max_bytes, ' ')},
  };
  for (const auto& [what, text] : bad) {
    SCOPED_TRACE(what);
    const fs::path f = t.path() / "p.json";
    test::write_text(f, text);
    auto r = load_profile(f, id);
    EXPECT_FALSE(r.profile);
    EXPECT_FALSE(r.reason.empty());
  }
  // The good text in a regular file loads: the cases above fail for their edit alone.
  test::write_text(t.path() / "good.json", good.dump());
  fs::permissions(t.path() / "good.json", fs::perms(0644));  // whatever the umask: only the owner writes it
  EXPECT_TRUE(load_profile(t.path() / "good.json", id).profile);

  // A symbolic link to a good profile, a FIFO (which must not block the reader), a folder, nothing at all.
  fs::create_symlink(t.path() / "good.json", t.path() / "link.json");
  ASSERT_EQ(::mkfifo((t.path() / "fifo.json").c_str(), 0600), 0);
  fs::create_directory(t.path() / "dir.json");
  for (const char* name : {"link.json", "fifo.json", "dir.json", "missing.json"}) {
    SCOPED_TRACE(name);
    auto r = load_profile(t.path() / name, id);
    EXPECT_FALSE(r.profile);
    EXPECT_FALSE(r.reason.empty());
  }
}

// A profile sizes threads and pinned memory, so only one the user controls counts: a file another user owns,
// or one that the group or others may write, is ignored with the reason.
TEST(device_profile, files_others_could_write_are_ignored_with_the_reason) {
  temp_dir t;
  const device_identity id{"nvme0n1", "wwid=eui.1234"};
  const fs::path f = save_profile(t.path(), sample(id));
  ASSERT_TRUE(load_profile(f, id).profile) << load_profile(f, id).reason;
  for (auto mode : {0664, 0646, 0666}) {
    SCOPED_TRACE(mode);
    fs::permissions(f, fs::perms(mode));
    const auto r = load_profile(f, id);
    EXPECT_FALSE(r.profile);
    EXPECT_NE(r.reason.find("writable by"), std::string::npos) << r.reason;
  }
  fs::permissions(f, fs::perms(0644));
  if (::geteuid() != 0) GTEST_SKIP() << "a file of another owner needs root to make (chown)";
  ASSERT_EQ(::chown(f.c_str(), 65534, 65534), 0);
  const auto r = load_profile(f, id);
  EXPECT_FALSE(r.profile);
  EXPECT_NE(r.reason.find("owned by uid 65534"), std::string::npos) << r.reason;
  // The learned profile is held to the same rule.
  learned_profile lp;
  lp.device = id;
  lp.shapes["host-read"] = {{4, 4 * kMiB}, 2.0, ""};
  const fs::path lf = save_learned(t.path(), lp);
  ASSERT_TRUE(load_learned(lf, id).learned);
  ASSERT_EQ(::chown(lf.c_str(), 65534, 65534), 0);
  EXPECT_NE(load_learned(lf, id).reason.find("owned by uid 65534"), std::string::npos);
}

// However a profile is nested, reading it walks no deeper than its format needs: deep nesting is refused while
// parsing (a recursive copy of a 500,000-level "read" value would exhaust the stack).
TEST(device_profile, deeply_nested_files_are_ignored_without_walking_them) {
  temp_dir t;
  const device_identity id{"nvme0n1", "wwid=eui.1234"};
  const std::size_t depth = k_profile_max_bytes / 2 - 1024;
  nlohmann::json good = nlohmann::json::parse(profile_json(sample(id)));
  std::string text = good.dump();
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string key : {"read", "write", "sweep"}) {
    SCOPED_TRACE(key);
    // The key's value replaced by the deep one.
    std::string bad = text;
    const auto at = bad.find("\"" + key + "\":");
    ASSERT_NE(at, std::string::npos);
    const auto begin = at + key.size() + 3;
    const auto end = bad.find(key == "sweep" ? "]" : "}", begin);
    bad.replace(begin, end + 1 - begin, deep);
    test::write_text(t.path() / "p.json", bad);
    fs::permissions(t.path() / "p.json", fs::perms(0644));
    const auto r = load_profile(t.path() / "p.json", id);
    EXPECT_FALSE(r.profile);
    EXPECT_NE(r.reason.find("nested more than"), std::string::npos) << r.reason;
  }
  learned_profile lp;
  lp.device = id;
  lp.shapes["staged-read"] = {{4, 4 * kMiB}, 2.0, ""};
  std::string l = learned_json(lp);
  l.insert(l.find("\"shapes\""), "\"x\":" + deep + ",");
  test::write_text(t.path() / "l.json", l);
  fs::permissions(t.path() / "l.json", fs::perms(0644));
  EXPECT_NE(load_learned(t.path() / "l.json", id).reason.find("nested more than"), std::string::npos);
}

}  // namespace
}  // namespace gdskit::engine
