// Said once per terminal session: the first ask in a session is true, later ones false; another session, or a
// folder that cannot hold the marker, asks again.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iterator>

#include "test_support.hpp"
#include "tools/session_once.hpp"

namespace gdskit::tools {
namespace {

using test::temp_dir;
namespace fs = std::filesystem;

// Sets an environment variable for the life of the object.
struct env_var {
  std::string name;
  env_var(const char* n, const std::string& value) : name(n) { ::setenv(n, value.c_str(), 1); }
  ~env_var() { ::unsetenv(name.c_str()); }
};

TEST(session_once, the_first_ask_of_a_session_is_the_only_true_one) {
  temp_dir t;
  env_var run("XDG_RUNTIME_DIR", t.path().string());
  EXPECT_TRUE(first_in_session("note-a"));
  EXPECT_FALSE(first_in_session("note-a"));
  EXPECT_FALSE(first_in_session("note-a"));
  EXPECT_TRUE(first_in_session("note-b")) << "each name has its own marker";
  EXPECT_EQ(session_marker_dir(), t.path() / "gdskit");
  EXPECT_FALSE(session_key().empty());
}

TEST(session_once, another_session_asks_again) {
  temp_dir t;
  env_var run("XDG_RUNTIME_DIR", t.path().string());
  ASSERT_TRUE(first_in_session("note"));
  // A child in a session of its own (setsid, as a new terminal's shell is) has not seen it.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setsid() < 0) ::_exit(3);
    ::_exit(first_in_session("note") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a new session did not see the note";
  EXPECT_FALSE(first_in_session("note"));
}

// A marker folder that is a link (planted in a shared place a variable named) is not used: nothing in its
// target is created or removed, and the note is said every time.
TEST(session_once, a_linked_marker_folder_is_not_used) {
  temp_dir t;
  fs::create_directories(t.path() / "elsewhere");
  test::write_text(t.path() / "elsewhere" / "note-0-old", "x");
  fs::create_directory_symlink(t.path() / "elsewhere", t.path() / "gdskit");
  env_var run("XDG_RUNTIME_DIR", t.path().string());
  EXPECT_TRUE(first_in_session("note"));
  EXPECT_TRUE(first_in_session("note"));
  EXPECT_TRUE(fs::exists(t.path() / "elsewhere" / "note-0-old")) << "a file behind the link was removed";
  EXPECT_EQ(std::distance(fs::directory_iterator(t.path() / "elsewhere"), fs::directory_iterator{}), 1);
}

TEST(session_once, without_a_usable_folder_it_is_said_every_time) {
  temp_dir t;
  test::write_text(t.path() / "file", "x");
  env_var run("XDG_RUNTIME_DIR", (t.path() / "file").string());  // not a folder: no marker can be kept
  EXPECT_TRUE(first_in_session("note"));
  EXPECT_TRUE(first_in_session("note"));
}

TEST(session_once, markers_of_earlier_boots_are_removed_from_the_cache_folder) {
  temp_dir t;
  ::unsetenv("XDG_RUNTIME_DIR");
  env_var cache("XDG_CACHE_HOME", t.path().string());
  const fs::path dir = t.path() / "gdskit/sessions";
  EXPECT_EQ(session_marker_dir(), dir);
  test::write_text(dir / "note-0000000000000000-1-1", "");
  EXPECT_TRUE(first_in_session("note"));
  EXPECT_FALSE(fs::exists(dir / "note-0000000000000000-1-1"));
  EXPECT_FALSE(first_in_session("note"));
}

}  // namespace
}  // namespace gdskit::tools
