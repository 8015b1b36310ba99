// The shared helpers for untrusted input and output: bounded reads (no FIFO wait, no endless device, a
// cap that is reported), the replacing JSON serializer, shell quoting, and the parsers of captured lines.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>

#include "posix/bounded_read.hpp"
#include "common/json_text.hpp"
#include "tools/shell_text.hpp"
#include "doctor/checks.hpp"
#include "doctor/probe.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace gd = gdskit::doctor;

TEST(bounded_read, regular_file_whole_and_capped) {
  gdskit::test::temp_dir d;
  std::ofstream(d / "f") << "0123456789";
  auto r = gdskit::read_bounded(d / "f", 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r.text, "0123456789");
  EXPECT_FALSE(r.capped);
  r = gdskit::read_bounded(d / "f", 10);
  EXPECT_EQ(*r.text, "0123456789");
  EXPECT_FALSE(r.capped);
  r = gdskit::read_bounded(d / "f", 4);
  EXPECT_EQ(*r.text, "0123");
  EXPECT_TRUE(r.capped);
  r = gdskit::read_bounded(d / "f", 4, /*tail=*/true);
  EXPECT_EQ(*r.text, "6789");
  EXPECT_TRUE(r.capped);
}

TEST(bounded_read, fifo_device_and_folder_are_refused_at_once) {
  gdskit::test::temp_dir d;
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = gdskit::read_bounded(d / "fifo", 100);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, std::errc::invalid_argument);
  EXPECT_EQ(r.reason(), "not a regular file (FIFO)");
  auto s = gdskit::scan_lines_bounded(d / "fifo", 100, 10, [](std::string_view) {});
  EXPECT_EQ(s.error, std::errc::invalid_argument);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  r = gdskit::read_bounded("/dev/zero", 100);
  EXPECT_EQ(r.error, std::errc::invalid_argument);
  r = gdskit::read_bounded(d.path(), 100);
  EXPECT_EQ(r.error, std::errc::is_a_directory);
  r = gdskit::read_bounded(d / "absent", 100);
  EXPECT_EQ(r.error, std::errc::no_such_file_or_directory);
}

TEST(bounded_read, scan_cuts_long_lines_and_stops_at_the_limit) {
  gdskit::test::temp_dir d;
  {
    std::ofstream f(d / "f");
    f << "short\n" << std::string(100, 'x') << "\nlast";
  }
  std::vector<std::string> lines;
  auto r = gdskit::scan_lines_bounded(d / "f", 1 << 20, 10, [&](std::string_view l) { lines.emplace_back(l); });
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.capped);
  EXPECT_EQ(lines, (std::vector<std::string>{"short", std::string(10, 'x'), "last"}));
  lines.clear();
  r = gdskit::scan_lines_bounded(d / "f", 8, 10, [&](std::string_view l) { lines.emplace_back(l); });
  EXPECT_TRUE(r.capped);
  EXPECT_EQ(lines.front(), "short");
}

TEST(json_text, invalid_utf8_is_replaced_not_thrown) {
  nlohmann::json j = {{"path", std::string("/data/caf\xe9")}, {"ok", std::string("h\xc3\xa9")}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  std::string text;
  ASSERT_NO_THROW(text = gdskit::json_text(j));
  auto back = nlohmann::json::parse(text);
  EXPECT_EQ(back["path"], "/data/caf\xef\xbf\xbd");
  EXPECT_EQ(back["ok"], "h\xc3\xa9");
}

TEST(shell_text, quoting_and_control_characters) {
  EXPECT_EQ(gdskit::shell_quote("/a b"), "'/a b'");
  EXPECT_EQ(gdskit::shell_quote("it's"), "'it'\\''s'");
  EXPECT_TRUE(gdskit::has_control_chars("/x\ntouch /tmp/PWNED"));
  EXPECT_TRUE(gdskit::has_control_chars(std::string("a\0b", 3)));
  EXPECT_TRUE(gdskit::has_control_chars("a\x7f"));
  EXPECT_FALSE(gdskit::has_control_chars("/caf\xc3\xa9 $(x) `y` 'z'"));
  EXPECT_EQ(gdskit::printable("a\nb\tc"), "a\\nb\\tc");
  EXPECT_EQ(gdskit::check_folder_argument("/nonexistent-gdskit"), std::errc::no_such_file_or_directory);
  EXPECT_EQ(gdskit::check_folder_argument("/etc/passwd"), std::errc::not_a_directory);
  EXPECT_EQ(gdskit::check_folder_argument("/tmp\n"), std::errc::invalid_argument);
  EXPECT_FALSE(gdskit::check_folder_argument("/"));
}

TEST(doctor_parsers, version_token_is_bounded_and_range_checked) {
  auto v = gd::find_version_token("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->text, "580.95.05");
  EXPECT_EQ(v->major, 580);
  v = gd::find_version_token("x 12.3 570.133 y");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->text, "570.133");
  EXPECT_FALSE(gd::find_version_token("NVRM version: 99999999999.1"));
  EXPECT_FALSE(gd::find_version_token("NVRM version: " + std::string(400000, '1') + ".1"));
  EXPECT_FALSE(gd::find_version_token("NVRM version: " + std::string(400000, '1')));
  EXPECT_FALSE(gd::find_version_token("no version 580. here"));
}

TEST(doctor_parsers, pci_addresses_in_sysfs_paths) {
  EXPECT_TRUE(gd::is_bdf("0000:01:00.0"));
  EXPECT_FALSE(gd::is_bdf("0000:01:00.8"));
  EXPECT_FALSE(gd::is_bdf("0000:01:00.0x"));
  EXPECT_EQ(gd::last_bdf_in("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/nvme/nvme0"), "0000:01:00.0");
  EXPECT_EQ(gd::last_bdf_in("/sys/devices/virtual/block/loop0"), "");
  EXPECT_EQ(gd::root_complex_in("/sys/devices/pci0000:80/0000:80:01.0"), "pci0000:80");
  EXPECT_EQ(gd::root_complex_in("/sys/devices/pcixyz/"), "");
  EXPECT_EQ(gd::last_bdf_in(std::string(400000, '0')), "");
}

TEST(doctor_parsers, strict_config_edits_only_the_value) {
  const std::string in = "{ // c\n \"properties\": { \"allow_compat_mode\" :\n true, \"x\": 1 } }\n";
  EXPECT_EQ(gd::strict_cufile_json(in), "{ // c\n \"properties\": { \"allow_compat_mode\" :\n false, \"x\": 1 } }\n");
  const std::string two = "{\"properties\": {\"allow_compat_mode\": false, \"allow_compat_mode\": true}}";
  EXPECT_EQ(gd::strict_cufile_json(two), "{\"properties\": {\"allow_compat_mode\": false, \"allow_compat_mode\": false}}");
  EXPECT_EQ(gd::parse_nvfs_stats("Reads : n=" + std::string(40, '9') + " ok=1\nReads: xn=3 n=7\n").reads, 7u);
}
