// The plan's line in the default output of bench, verify and load: the route and a few words, the rest with -v.
#include <gtest/gtest.h>

#include "tools/path_line.hpp"

namespace gdskit::tools {
namespace {

const std::vector<std::string> k_reasons = {
    "nvidia-fs not loaded (no /proc/driver/nvidia-fs)",
    "file is on vda, not NVMe",
    "/run/udev missing: cuFile cannot register files",
    "O_DIRECT staged reads: no profile (run gdskit tune); now depth 2, 4.00 MiB; adaptive (measuring)",
};

TEST(path_line, the_default_line_is_the_route_and_its_first_reason_in_a_few_words) {
  const std::string line = path_line("staged", k_reasons, false);
  EXPECT_EQ(line, "staged (nvidia-fs not loaded; 3 more reasons with -v)");
  EXPECT_EQ(path_line("host", {"buffer is host memory"}, false), "host (buffer is host memory)");
  EXPECT_EQ(path_line("host", {"no usable GPU: libcuda.so.1 not found"}, false), "host (no usable GPU; more with -v)");
  EXPECT_EQ(path_line("host", {}, false), "host");
}

TEST(path_line, verbose_gives_every_reason) {
  const std::string line = path_line("staged", k_reasons, true);
  for (const auto& r : k_reasons) EXPECT_NE(line.find(r), std::string::npos) << line;
}

TEST(path_line, a_long_first_reason_is_cut_at_a_word) {
  const std::string long_reason(200, 'x');
  const std::string words = "a few words that go on and on well past what one short line should hold for anyone";
  EXPECT_LE(brief_reason({long_reason}).size(), k_brief_reason_chars);
  const std::string b = brief_reason({words});
  EXPECT_LE(b.size(), k_brief_reason_chars);
  EXPECT_TRUE(b.ends_with("...")) << b;
  EXPECT_EQ(b.find("  "), std::string::npos) << b;
  EXPECT_EQ(words.rfind(b.substr(0, b.size() - 3), 0), 0u) << b;
}

}  // namespace
}  // namespace gdskit::tools
