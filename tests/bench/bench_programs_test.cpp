// The benchmark programs' shared checks: the file each makes and reads, and its arguments. A bench given the path
// of someone's file, a FIFO or "--help" must neither overwrite it, hang, nor make a file of that name.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "test_support.hpp"

using namespace gdskit;
using namespace gdskit::bench_support;

namespace {

std::string contents(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

args_verdict verdict(std::vector<std::string> args, std::initializer_list<std::string_view> options = {}) {
  args.insert(args.begin(), "bench");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const args_verdict v = check_args(static_cast<int>(argv.size()), argv.data(), "usage: bench FILE\n", options);
  testing::internal::GetCapturedStdout();
  testing::internal::GetCapturedStderr();
  return v;
}

}  // namespace

TEST(bench_programs, a_missing_file_is_made_and_one_of_the_right_size_is_used_as_it_is) {
  test::temp_dir dir;
  const auto p = dir / "data";
  ensure_file(p, 3 * 4096 + 17);
  ASSERT_EQ(std::filesystem::file_size(p), 3u * 4096 + 17);
  const std::string first = contents(p);
  EXPECT_NE(first, std::string(first.size(), '\0'));  // random data, not a hole
  ensure_file(p, 3 * 4096 + 17);
  EXPECT_EQ(contents(p), first);
}

TEST(bench_programs, a_file_of_another_size_or_kind_is_refused_and_left_alone) {
  test::temp_dir dir;
  const auto mine = dir / "mine.txt";
  std::ofstream(mine) << "someone's data";
  EXPECT_THROW(ensure_file(mine, 1 << 20), std::runtime_error);
  EXPECT_EQ(contents(mine), "someone's data");
  EXPECT_THROW(check_scratch(mine, 1 << 20), std::runtime_error);
  EXPECT_EQ(contents(mine), "someone's data");

  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(ensure_file(fifo, 4096), std::runtime_error);  // refused at once: never opened, so no hang

  const auto right_size = dir / "right";
  ensure_file(right_size, 4096);
  const auto link = dir / "link";
  std::filesystem::create_symlink(right_size, link);
  EXPECT_THROW(ensure_file(link, 4096), std::runtime_error);
  EXPECT_THROW(ensure_file(dir.path(), 4096), std::runtime_error);

  check_scratch(dir / "absent", 4096);  // nothing there: the bench may write it
  check_scratch(right_size, 4096);      // what an earlier run left
}

TEST(bench_programs, help_and_unknown_options_are_told_apart_from_file_names) {
  EXPECT_EQ(verdict({"--help"}), args_verdict::help);
  EXPECT_EQ(verdict({"/tmp/f", "1G", "-h"}), args_verdict::help);
  EXPECT_EQ(verdict({"--bogus"}), args_verdict::bad);
  EXPECT_EQ(verdict({"/tmp/f", "1G", "-x"}), args_verdict::bad);
  EXPECT_EQ(verdict({"/tmp/f", "1G", "--json", "out.json"}, {"--json"}), args_verdict::run);
  EXPECT_EQ(verdict({"/tmp/f", "1G", "3"}), args_verdict::run);
  EXPECT_EQ(verdict({}), args_verdict::run);

  EXPECT_EQ(parse_count("16", 1, 1024), 16u);
  EXPECT_EQ(parse_count("1024", 1, 1024), 1024u);
  EXPECT_FALSE(parse_count("0", 1, 1024));
  EXPECT_FALSE(parse_count("1025", 1, 1024));
  EXPECT_FALSE(parse_count("4x", 1, 1024));
  EXPECT_FALSE(parse_count("", 1, 1024));
  EXPECT_FALSE(parse_count("-1", 1, 1024));
  EXPECT_FALSE(parse_count(" 4", 1, 1024));
  EXPECT_FALSE(parse_count("99999999999999999999999", 1, 1024));
}
