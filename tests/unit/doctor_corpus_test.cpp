// The doctor on the corpus of reported failures (tests/fixtures/systems/corpus/*): each root reproduces one public
// report, and its README states the verdict, the first failing layer, the check that must name the cause and a
// phrase the user must read in the reasons. Not one of them may be called "true GDS" unless the README says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "doctor/doctor.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace gd = gdskit::doctor;

namespace {

const fs::path corpus = fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/systems/corpus";

// The "key: value" lines of the README's expectation block.
std::map<std::string, std::string> expectations(const fs::path& readme) {
  std::ifstream in(readme);
  std::map<std::string, std::string> out;
  for (std::string l; std::getline(in, l);) {
    for (const char* key : {"verdict", "first failing layer", "check", "says"}) {
      const std::string k = std::string(key) + ": ";
      if (l.rfind(k, 0) == 0) out[key] = l.substr(k.size());
    }
  }
  return out;
}

std::vector<fs::path> cases() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(corpus))
    if (e.is_directory()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(doctor_corpus, has_at_least_fifteen_reported_cases_with_expectations) {
  const auto all = cases();
  EXPECT_GE(all.size(), 15u);
  for (const auto& c : all) {
    const auto e = expectations(c / "README.md");
    EXPECT_EQ(e.size(), 4u) << c << ": README needs verdict, first failing layer, check and says";
    std::ifstream in(c / "README.md");
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("Report: "), std::string::npos) << c << ": no citation";
  }
}

TEST(doctor_corpus, every_case_gets_its_reported_verdict_and_first_failing_layer) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.filename().string());
    const auto e = expectations(c / "README.md");
    auto root = gd::system_root::captured(c);
    const auto r = gd::diagnose(root, gd::default_path(root));
    EXPECT_EQ(gd::to_string(r.result.kind), e.at("verdict")) << r.result.line;
    if (e.at("verdict") != "true_gds") {
      EXPECT_NE(r.result.kind, gd::verdict_kind::true_gds) << "false GDS works: " << r.result.line;
      EXPECT_EQ(r.result.first_failing_layer, e.at("first failing layer")) << r.result.line;
    }
    // The check that names the cause has the expected outcome, and the user reads the phrase in the reasons.
    const gd::check* named = nullptr;
    for (const auto& l : r.layers)
      for (const auto& k : l.checks)
        if (k.id == e.at("check") && (named == nullptr || k.state == gd::status::fail)) named = &k;
    ASSERT_NE(named, nullptr) << e.at("check") << " not in the report";
    if (e.at("verdict") == "true_gds") {
      EXPECT_EQ(named->state, gd::status::ok) << named->summary;
      EXPECT_EQ(r.result.line.rfind("true GDS", 0), 0u);
    } else {
      EXPECT_EQ(named->state, gd::status::fail) << named->summary;
      std::string all = r.result.line;
      for (const auto& why : r.result.reasons) all += "\n" + why;
      EXPECT_NE(all.find(e.at("says")), std::string::npos) << "'" << e.at("says") << "' not in:\n" << all;
    }
    EXPECT_FALSE(named->evidence.empty()) << named->id << " names no evidence";
    if (named->state == gd::status::fail) EXPECT_FALSE(named->fix.empty()) << named->id << " names no fix";
  }
}

TEST(doctor_corpus, a_capture_of_each_case_gives_the_same_verdict) {
  // --capture records what the checks read (listings of links included) and --root reads it back.
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.filename().string());
    auto root = gd::system_root::captured(c);
    const std::string path = gd::default_path(root);
    const auto before = gd::diagnose(root, path);
    gdskit::test::temp_dir dir;
    ASSERT_FALSE(gd::write_capture(root, path, dir.path() / "cap.tar.gz"));
    gd::private_folder out;
    std::string why;
    ASSERT_FALSE(gd::extract_capture(dir.path() / "cap.tar.gz", out.path(), why)) << why;
    auto again = gd::system_root::captured(out.path());
    const auto after = gd::diagnose(again, gd::default_path(again));
    EXPECT_EQ(after.result.line, before.result.line);
    EXPECT_EQ(after.result.reasons, before.result.reasons);
  }
}
