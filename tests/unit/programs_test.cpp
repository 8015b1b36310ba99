// Programs the tools run are found in the system folders by absolute path, never through $PATH, and start with
// PATH set to those folders.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "doctor/doctor.hpp"
#include "test_support.hpp"
#include "tools/programs.hpp"

namespace gdskit::tools {
namespace {

namespace fs = std::filesystem;

// Restores PATH when it goes.
struct path_guard {
  std::string saved = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  explicit path_guard(const std::string& path) { ::setenv("PATH", path.c_str(), 1); }
  ~path_guard() { ::setenv("PATH", saved.c_str(), 1); }
};

// A script `name` in `dir` that creates `marker` when run.
void fake_program(const fs::path& dir, const std::string& name, const fs::path& marker) {
  test::write_text(dir / name, "#!/bin/sh\ntouch '" + marker.string() + "'\necho fake\n");
  ::chmod((dir / name).c_str(), 0755);
}

TEST(programs, found_in_the_system_folders_never_through_path) {
  test::temp_dir t;
  const fs::path marker = t.path() / "ran";
  fake_program(t.path() / "bin", "dmesg", marker);
  fake_program(t.path() / "bin", "gdskit-no-such-program", marker);
  path_guard hostile(t.path().string() + "/bin:" + (std::getenv("PATH") ? std::getenv("PATH") : ""));
  EXPECT_FALSE(find_program("gdskit-no-such-program"));
  if (auto sh = find_program("sh")) {
    EXPECT_TRUE(sh->is_absolute());
    EXPECT_NE(sh->string().rfind(t.path().string(), 0), 0u);
  }
  if (auto dmesg = find_program("dmesg")) EXPECT_NE(dmesg->parent_path(), t.path() / "bin");
  // Names that are paths are refused.
  EXPECT_FALSE(find_program("../bin/sh"));
  EXPECT_FALSE(find_program("/bin/sh"));
  EXPECT_FALSE(find_program(""));
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(searched_dirs(), "/usr/bin, /bin, /usr/sbin, /sbin");
}

TEST(programs, children_get_the_system_path_so_what_they_run_is_found_there_too) {
  test::temp_dir t;
  const fs::path marker = t.path() / "ran";
  fake_program(t.path() / "bin", "true", marker);
  path_guard hostile(t.path().string() + "/bin");
  const auto sh = find_program("sh");
  ASSERT_TRUE(sh);
  auto out = run_captured(*sh, {"-c", "echo \"$PATH\"; true"}, 4096);
  ASSERT_TRUE(out.ok()) << out.error.message();
  EXPECT_EQ(out.text, std::string(system_path) + "\n");
  EXPECT_FALSE(fs::exists(marker));
  // Exit status and output limits.
  EXPECT_EQ(run_captured(*sh, {"-c", "exit 3"}, 16).error, std::errc::io_error);
  out = run_captured(*sh, {"-c", "echo 0123456789; echo to-stderr >&2"}, 4);
  EXPECT_EQ(out.text, "0123");
  EXPECT_TRUE(out.capped);
  EXPECT_EQ(run_captured(*sh, {"-c", "echo to-stderr >&2"}, 64, stderr_mode::discard).text, "");
  EXPECT_EQ(run_attached(*sh, {"-c", "[ \"$PATH\" = /x:/y ] && exit 7"}, "/x:/y"), 7);
  EXPECT_EQ(run_attached(t.path() / "missing", {}), 127);
}

TEST(programs, the_doctor_says_which_programs_it_did_not_find) {
  test::temp_dir t;
  const fs::path marker = t.path() / "ran";
  fake_program(t.path() / "bin", "dmesg", marker);
  fake_program(t.path() / "bin", "nvidia-smi", marker);
  path_guard hostile(t.path().string() + "/bin");
  // The system folders hold nothing (an empty folder stands in for them).
  fs::create_directories(t.path() / "empty");
  program_dirs_for_testing none({(t.path() / "empty").string()});
  auto root = doctor::system_root::live_system();
  const auto dmesg = root.command("dmesg");
  EXPECT_FALSE(dmesg.ok());
  EXPECT_EQ(dmesg.error, std::errc::no_such_file_or_directory);
  EXPECT_NE(dmesg.reason().find("dmesg not found in " + (t.path() / "empty").string()), std::string::npos)
      << dmesg.reason();
  auto r = doctor::diagnose(root, "/");
  ASSERT_FALSE(r.programs_not_found.empty());
  EXPECT_EQ(r.programs_not_found.front().name, "dmesg");
  const std::string json = doctor::render_json(r);
  EXPECT_NE(json.find("\"programs_not_found\""), std::string::npos);
  EXPECT_NE(json.find("\"nvidia-smi\""), std::string::npos);
  EXPECT_NE(doctor::render_text(r, false, false).find("programs not found"), std::string::npos);
  EXPECT_NE(doctor::render_text(r, false, true).find("programs not found"), std::string::npos);
  EXPECT_FALSE(fs::exists(marker));
}

}  // namespace
}  // namespace gdskit::tools
