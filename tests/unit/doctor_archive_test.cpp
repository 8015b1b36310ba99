// Hostile input on the doctor's own surfaces: the tar reader behind --root ARCHIVE, archive names tar would
// misread, roots whose links lead out, JSON nested without end, and control bytes on their way to a terminal.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "doctor/checks.hpp"
#include "doctor/doctor.hpp"
#include "doctor/json_input.hpp"
#include "doctor/system_root.hpp"
#include "doctor/tar_reader.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace gd = gdskit::doctor;

namespace {

fs::path fixture(const std::string& name) { return fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/systems" / name; }

// A ustar (or GNU, `gnu`) header for `name`, with the checksum filled in.
std::string header(const std::string& name, char type, std::uint64_t size, bool gnu = true,
                   const std::string& owner = "root") {
  std::string h(512, '\0');
  h.replace(0, std::min<std::size_t>(name.size(), 100), name.substr(0, 100));
  h.replace(100, 7, "0000644");
  h.replace(108, 7, "0000000");
  h.replace(116, 7, "0000000");
  char sz[13];
  std::snprintf(sz, sizeof sz, "%011llo", static_cast<unsigned long long>(size));
  h.replace(124, 11, sz);
  h.replace(136, 11, "00000000000");
  h[156] = type;
  if (gnu) h.replace(257, 8, std::string("ustar  \0", 8));
  else h.replace(257, 8, std::string("ustar\0" "00", 8));
  h.replace(265, std::min<std::size_t>(owner.size(), 31), owner.substr(0, 31));
  unsigned sum = 0;
  for (std::size_t i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  char ck[8];
  std::snprintf(ck, sizeof ck, "%06o", sum);
  h.replace(148, 7, std::string(ck, 6) + '\0');
  return h;
}

std::string padded(const std::string& data) { return data + std::string((512 - data.size() % 512) % 512, '\0'); }
std::string member(const std::string& name, const std::string& data, char type = '0') {
  return header(name, type, data.size()) + padded(data);
}
const std::string end_marker(1024, '\0');

struct recording_sink : gd::tar_sink {
  std::vector<gd::tar_member> members;
  std::string bytes;
  std::error_code begin(const gd::tar_member& m) override {
    members.push_back(m);
    return {};
  }
  std::error_code data(std::string_view b) override {
    bytes.append(b);
    return {};
  }
  std::error_code end() override { return {}; }
};

// Feeds `stream` in pieces of `step` bytes; returns the first error (finish included).
std::error_code read_all(const std::string& stream, recording_sink& sink, std::string& why, gd::tar_limits lim = {},
                         std::size_t step = 7) {
  gd::tar_reader r(sink, lim);
  for (std::size_t i = 0; i < stream.size(); i += step) {
    if (auto ec = r.feed(std::string_view(stream).substr(i, step))) {
      why = r.why();
      return ec;
    }
  }
  auto ec = r.finish();
  why = r.why();
  return ec;
}

void write_gzip(const fs::path& out, const std::string& tar) {
  const fs::path raw = out.string() + ".raw";
  std::ofstream(raw, std::ios::binary) << tar;
  ASSERT_EQ(std::system(("gzip -c < '" + raw.string() + "' > '" + out.string() + "'").c_str()), 0);
  fs::remove(raw);
}

}  // namespace

TEST(doctor_tar, members_pass_through_with_their_data) {
  const std::string stream = member("./", "", '5') + member("./proc/", "", '5') + member("./proc/modules", "nvidia 1\n") +
                             member("commands/dmesg.txt", std::string(1500, 'x')) + end_marker + "trailing junk";
  for (std::size_t step : {1u, 7u, 512u, 100000u}) {
    recording_sink s;
    std::string why;
    ASSERT_FALSE(read_all(stream, s, why, {}, step)) << why;
    ASSERT_EQ(s.members.size(), 3u);  // "./" itself is not a member to create
    EXPECT_EQ(s.members[0].name, "proc");
    EXPECT_TRUE(s.members[0].directory);
    EXPECT_EQ(s.members[1].name, "proc/modules");
    EXPECT_EQ(s.members[2].size, 1500u);
    EXPECT_EQ(s.bytes, "nvidia 1\n" + std::string(1500, 'x'));
  }
}

TEST(doctor_tar, long_names_and_pax_paths_are_read) {
  const std::string longname = "sys/" + std::string(150, 'a') + "/dev";
  std::string stream = header("././@LongLink", 'L', longname.size() + 1) + padded(longname + '\0') +
                       header("truncated-name", '0', 3) + padded("abc");
  const std::string rec = "path=sys/b/realpath.txt\n";
  const std::string pax = std::to_string(rec.size() + 3) + " " + rec;
  ASSERT_EQ(pax.size(), std::stoul(pax.substr(0, pax.find(' '))));
  stream += header("PaxHeaders/x", 'x', pax.size(), false) + padded(pax) + header("short", '0', 2, false) + padded("hi");
  stream += end_marker;
  recording_sink s;
  std::string why;
  ASSERT_FALSE(read_all(stream, s, why)) << why;
  ASSERT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.members[0].name, longname);
  EXPECT_EQ(s.members[1].name, "sys/b/realpath.txt");
}

TEST(doctor_tar, sizes_are_checked_from_the_header_whatever_the_owner_name) {
  // An owner name with spaces once hid the size field of a listing; the header's own field is what counts now.
  const std::string big = header("proc/modules", '0', 600ull << 20, true, "x 0");
  recording_sink s;
  std::string why;
  EXPECT_TRUE(read_all(big + std::string(4096, '\0'), s, why));
  EXPECT_NE(why.find("512 MiB"), std::string::npos) << why;
  EXPECT_TRUE(s.members.empty());  // refused before the sink saw it
  // The total over several members, with a small limit.
  gd::tar_limits lim;
  lim.max_total_bytes = 3000;
  recording_sink s2;
  const std::string two = member("a", std::string(2000, 'a')) + member("b", std::string(2000, 'b')) + end_marker;
  EXPECT_TRUE(read_all(two, s2, why, lim));
  EXPECT_EQ(s2.members.size(), 1u);
  lim = {};
  lim.max_members = 2;
  recording_sink s3;
  EXPECT_TRUE(read_all(member("a", "") + member("b", "") + member("c", "") + end_marker, s3, why, lim));
  EXPECT_NE(why.find("more than 2 members"), std::string::npos) << why;
}

TEST(doctor_tar, links_devices_escapes_and_damage_are_refused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {header("etc", '2', 0), "link"},
      {header("etc", '1', 0), "link"},
      {header("dev/x", '3', 0), "special file"},
      {header("fifo", '6', 0), "special file"},
      {header("/etc/passwd", '0', 0), "absolute"},
      {header("a/../../x", '0', 0), ".."},
      {header("a\x1b[2Jb", '0', 0), "control characters"},
      {std::string(512, 'x'), "not a tar archive"},
      {"", "empty"},
      {header("a", '0', 10) + "abc", "truncated"},
      {member("a", "") + std::string(512, '\0') + member("b", ""), "damaged"},
  };
  for (const auto& [stream, want] : cases) {
    recording_sink s;
    std::string why;
    EXPECT_TRUE(read_all(stream, s, why)) << want;
    EXPECT_NE(why.find(want), std::string::npos) << "want '" << want << "', got '" << why << "'";
  }
  std::string bad = member("a", "xyz");
  bad[0] = 'b';  // checksum no longer matches
  recording_sink s;
  std::string why;
  EXPECT_TRUE(read_all(bad + end_marker, s, why));
}

TEST(doctor_capture, archive_names_with_colons_or_a_dash_are_local_files) {
  auto src = gd::system_root::captured(fixture("p2p-einval"));
  const auto before = gd::diagnose(src, "/data");
  gdskit::test::temp_dir dir;
  for (const std::string name : {"capture-2026-11-29T10:00:00.tar.gz", "-rf.tar.gz", "host:path.tar.gz"}) {
    const fs::path archive = dir.path() / name;
    ASSERT_FALSE(gd::write_capture(src, "/data", archive)) << name;
    gd::private_folder out;
    std::string why;
    ASSERT_FALSE(gd::extract_capture(archive, out.path(), why)) << name << ": " << why;
    auto again = gd::system_root::captured(out.path());
    EXPECT_EQ(gd::diagnose(again, gd::default_path(again)).result.line, before.result.line) << name;
  }
}

TEST(doctor_capture, a_refused_archive_writes_at_most_the_limit_and_leaves_nothing) {
  gdskit::test::temp_dir dir;
  const fs::path archive = dir.path() / "big.tar.gz";
  // Small files first, then one whose data runs past the limit: the early ones are removed again.
  write_gzip(archive, member("proc/modules", "nvidia 1\n") + member("sys/block/x", std::string(3 << 20, 'z')) + end_marker);
  gd::tar_limits lim;
  lim.max_total_bytes = 1 << 20;
  gd::private_folder out;
  std::string why;
  EXPECT_TRUE(gd::extract_capture(archive, out.path(), why, lim));
  EXPECT_NE(why.find("unpacks to more than 1 MiB"), std::string::npos) << why;
  EXPECT_TRUE(fs::is_empty(out.path()));
  // A member listed twice is refused rather than overwritten.
  write_gzip(archive, member("proc/modules", "a") + member("proc/modules", "b") + end_marker);
  gd::private_folder out2;
  EXPECT_TRUE(gd::extract_capture(archive, out2.path(), why));
  EXPECT_TRUE(fs::is_empty(out2.path()));
  // Not gzip at all.
  std::ofstream(archive, std::ios::binary | std::ios::trunc) << member("a", "b") << end_marker;
  gd::private_folder out3;
  EXPECT_TRUE(gd::extract_capture(archive, out3.path(), why));
  EXPECT_NE(why.find("gzip"), std::string::npos) << why;
}

TEST(doctor_root, reads_stay_inside_the_root) {
  gdskit::test::temp_dir dir;
  const fs::path root = dir.path() / "root";
  fs::create_directories(root / "proc/sys/kernel");
  fs::create_directories(root / "real");
  std::ofstream(dir.path() / "secret") << "secret";
  std::ofstream(root / "real/osrelease") << "6.8.0\n";
  fs::create_symlink(dir.path() / "secret", root / "abs");
  fs::create_symlink("../secret", root / "climb");
  fs::create_symlink("../../real/osrelease", root / "proc/sys/inside");
  fs::create_symlink("..", root / "proc/up");
  fs::create_symlink("loop", root / "loop");
  auto r = gd::system_root::captured(root);
  EXPECT_FALSE(r.read("abs").ok());
  EXPECT_FALSE(r.read("climb").ok());
  EXPECT_NE(r.read("climb").reason().find("outside"), std::string::npos);
  EXPECT_FALSE(r.read("../secret").ok());
  EXPECT_FALSE(r.read("proc/up/up/../secret").ok());
  EXPECT_EQ(r.read("proc/sys/inside").text.value_or(""), "6.8.0\n");
  EXPECT_EQ(r.read("proc/up/real/osrelease").text.value_or(""), "6.8.0\n");
  EXPECT_EQ(r.read("loop").error, std::errc::too_many_symbolic_link_levels);
  EXPECT_FALSE(r.exists("abs"));
  EXPECT_TRUE(r.exists("proc/sys/inside"));
  std::error_code ec;
  EXPECT_EQ(r.list("proc/up", ec), (std::vector<std::string>{"abs", "climb", "loop", "proc", "real"}));
  fs::create_symlink(dir.path(), root / "out");
  EXPECT_TRUE(r.list("out", ec).empty());
  EXPECT_TRUE(ec);
  for (const auto& [rel, text] : r.recorded()) EXPECT_EQ(text.find("secret"), std::string::npos) << rel;
}

TEST(doctor_json, nesting_is_bounded) {
  std::string why;
  const std::size_t deep = 200000;
  auto j = gd::parse_json_bounded(std::string(deep, '[') + std::string(deep, ']'), false, why);
  EXPECT_TRUE(j.is_discarded());
  EXPECT_NE(why.find("nested deeper than 64"), std::string::npos) << why;
  const int ok_depth = gd::max_json_depth - 1;
  j = gd::parse_json_bounded("{\"a\": " + std::string(ok_depth, '[') + std::string(ok_depth, ']') + "} // c", true, why);
  EXPECT_TRUE(j.is_object()) << why;
  j = gd::parse_json_bounded("{\"a\": [1,", false, why);
  EXPECT_TRUE(j.is_discarded());
  EXPECT_EQ(why, "not valid JSON");
  // A probe report line nested without end is refused, not followed down.
  std::string cwhy;
  EXPECT_FALSE(gd::parse_child_report(std::string(gd::kChildMarker) + "{\"cuda_init\": " + std::string(deep, '[') +
                                          std::string(deep, ']') + "}\n",
                                      &cwhy));
  EXPECT_NE(cwhy.find("nested"), std::string::npos) << cwhy;
}

TEST(doctor_render, control_bytes_from_files_never_reach_the_terminal) {
  gd::report r;
  r.root = "/tmp/root\x1b]0;title\a";
  r.path = "/data";
  r.result.line = "cuFile unusable";
  gd::layer l{"gpu", "GPU and driver", {}};
  gd::check c{"gpu.devices", "NVIDIA GPUs", gd::status::fail, gd::impact::cufile, "model \x1b[2J\x9b" "31m", {}, "fix \a"};
  c.evidence.push_back({"proc/x\x07", 1, "Model: \x1b[31mred\x7f"});
  l.checks.push_back(c);
  r.layers.push_back(l);
  for (bool colour : {false, true}) {
    std::string out = gd::render_text(r, colour);
    if (colour) {
      // Only our own colour sequences: ESC followed by "[" and digits/semicolons and "m".
      for (std::size_t p = out.find('\x1b'); p != std::string::npos; p = out.find('\x1b', p + 1)) {
        const auto m = out.find('m', p);
        ASSERT_NE(m, std::string::npos);
        EXPECT_EQ(out.substr(p + 1, m - p - 1).find_first_not_of("[0123456789;"), std::string::npos) << out.substr(p, 12);
      }
    } else {
      EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
    }
    EXPECT_EQ(out.find('\a'), std::string::npos);
    EXPECT_EQ(out.find('\x7f'), std::string::npos);
    EXPECT_NE(out.find("\\x1b[2J"), std::string::npos) << out;
  }
}
