// Reads under a captured system root: every path resolved inside it, links that leave it refused.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <algorithm>
#include <filesystem>

#include "posix/in_root.hpp"
#include "test_support.hpp"

namespace gdskit::posix {
namespace {

namespace fs = std::filesystem;
const std::string marker = "MARKER-OUTSIDE-THE-ROOT";

struct hostile_root {
  test::temp_dir t;
  fs::path root = t.path() / "root";
  hostile_root() {
    test::write_text(t.path() / "outside/secret", marker + "\n");
    test::write_text(root / "etc/real", "inside\n");
    test::write_text(root / "sys/devices/pci0000:00/nvme0n1/nvme0n1p1/partition", "1\n");
    fs::create_directories(root / "sys/dev/block");
    fs::create_directories(root / "proc");
    fs::create_symlink(t.path() / "outside/secret", root / "etc/absolute");
    fs::create_symlink("../../outside/secret", root / "etc/climbing");
    fs::create_symlink("real", root / "etc/relative");
    fs::create_symlink("../etc/relative", root / "proc/chain");
    fs::create_directory_symlink("../outside", root / "escape");
    fs::create_directory_symlink("../../devices/pci0000:00/nvme0n1/nvme0n1p1", root / "sys/dev/block/259:1");
    fs::create_symlink("loop", root / "proc/loop");
  }
};

TEST(in_root, links_are_followed_only_while_they_stay_inside) {
  hostile_root h;
  const root_files files(h.root);
  EXPECT_FALSE(files.live());
  EXPECT_EQ(files.read("etc/relative", 4096).text.value_or(""), "inside\n");
  EXPECT_EQ(files.read("/proc/chain", 4096).text.value_or(""), "inside\n");
  for (const char* rel : {"etc/absolute", "etc/climbing", "escape/secret", "../outside/secret", "etc/../../outside/secret"}) {
    const bounded_text r = files.read(rel, 4096);
    EXPECT_FALSE(r.ok()) << rel;
    EXPECT_EQ(r.text.value_or("").find(marker), std::string::npos) << rel;
    EXPECT_EQ(r.error, std::errc::permission_denied) << rel;
    EXPECT_FALSE(files.exists(rel)) << rel;
  }
  EXPECT_FALSE(files.read("proc/loop", 4096).ok());
  EXPECT_EQ(files.read("proc/loop", 4096).error, std::errc::too_many_symbolic_link_levels);
  bool saw_marker = false;
  (void)files.scan_lines("etc/climbing", 1 << 20, 4096, [&](std::string_view l) { saw_marker |= l == marker; });
  EXPECT_FALSE(saw_marker);
  std::error_code ec;
  EXPECT_TRUE(files.list("escape", ec).empty());
  EXPECT_EQ(ec, std::errc::permission_denied);
  EXPECT_FALSE(files.is_directory("escape"));
  EXPECT_TRUE(files.is_directory("sys/dev/block/259:1"));
}

TEST(in_root, resolve_names_what_a_path_reaches_inside_the_root) {
  hostile_root h;
  const root_files files(h.root);
  EXPECT_EQ(files.resolve("sys/dev/block/259:1").value_or("?"), "sys/devices/pci0000:00/nvme0n1/nvme0n1p1");
  EXPECT_EQ(files.resolve("proc/chain").value_or("?"), "etc/real");
  EXPECT_EQ(files.resolve("").value_or("?"), "");
  EXPECT_EQ(files.resolve("etc/..").value_or("?"), "");
  EXPECT_FALSE(files.resolve("escape"));
  EXPECT_FALSE(files.resolve("etc/absolute"));
  EXPECT_FALSE(files.resolve("missing"));
  std::error_code ec;
  std::string why;
  EXPECT_FALSE(resolve_in_root(h.root, "etc/climbing", ec, why));
  EXPECT_EQ(ec, std::errc::permission_denied);
  EXPECT_NE(why.find("outside"), std::string::npos) << why;
  EXPECT_TRUE(files.exists("sys/dev/block/259:1/partition"));
  auto names = files.list("etc", ec);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"absolute", "climbing", "real", "relative"}));
  EXPECT_EQ(files.list("sys/devices/pci0000:00/nvme0n1", ec, 0).size(), 0u);  // the entry limit holds
}

TEST(in_root, the_live_root_reads_paths_as_they_are) {
  const root_files live("/");
  EXPECT_TRUE(live.live());
  EXPECT_TRUE(live.exists("proc/self"));
  EXPECT_TRUE(live.read("proc/self/status", 1 << 16).ok());
  EXPECT_EQ(live.resolve("proc/self").value_or(""), "proc/" + std::to_string(::getpid()));
  EXPECT_FALSE(root_files("/tmp").live());
}

}  // namespace
}  // namespace gdskit::posix
