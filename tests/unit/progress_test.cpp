// The terminal progress reporter: what it prints, how often, and that it leaves a clean line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "common/progress.hpp"

using gdskit::progress_reporter;

namespace {

struct fake_clock {
  double t = 100.0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

std::size_t count(const std::string& s, char c) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), c)); }

}  // namespace

TEST(Progress, RenderShowsPercentRateAndEta) {
  EXPECT_EQ(progress_reporter::render("read", 1ull << 30, 4ull << 30, 2.0), "read   25%  1.00 GiB / 4.00 GiB  512.00 MiB/s  ETA 6s");
  EXPECT_EQ(progress_reporter::render("bench", 3u << 20, 0, 1.0), "bench  3.00 MiB  3.00 MiB/s");
  EXPECT_EQ(progress_reporter::render("x", 0, 100, 0.0), "x    0%  0 B / 100 B  0 B/s  ETA ?");
  const std::string slow = progress_reporter::render("x", 100, 7200u * 100u + 100u, 1.0);
  EXPECT_EQ(slow.substr(slow.find("ETA")), "ETA 2h00m");
}

TEST(Progress, TerminalRedrawsInPlaceAtMostFiveTimesASecondAndClearsTheLine) {
  std::ostringstream out;
  fake_clock c;
  {
    progress_reporter p(progress_reporter::style::terminal, out, c.fn());
    p.start(1000, "copy");
    p.advance(10);
    EXPECT_EQ(out.str(), "") << "quiet for the first 0.2 s";
    for (int i = 0; i < 100; ++i) {  // 100 reports over 1 s
      c.t += 0.01;
      p.advance(5);
    }
    c.t += 1.0;
    p.advance(0);
    p.finish();
    p.finish();  // idempotent
  }
  const std::string s = out.str();
  const std::size_t draws = count(s, '\r') - 2;  // the clearing writes two
  EXPECT_GE(draws, 4u);
  EXPECT_LE(draws, 6u) << s;
  EXPECT_EQ(count(s, '\n'), 0u) << "a terminal line is redrawn, never scrolled";
  EXPECT_NE(s.find("copy   51%"), std::string::npos) << s;
  // The last write blanks the line and returns to its start.
  const auto last = s.rfind('\r', s.size() - 2);
  EXPECT_EQ(s.back(), '\r');
  EXPECT_EQ(s.substr(last + 1, s.size() - last - 2).find_first_not_of(' '), std::string::npos) << s;
}

TEST(Progress, LinesOnceASecondAndALastLine) {
  std::ostringstream out;
  fake_clock c;
  progress_reporter p(progress_reporter::style::lines, out, c.fn());
  p.start(0, "bench");
  for (int i = 0; i < 30; ++i) {
    c.t += 0.1;
    p.advance(1 << 20);
  }
  p.finish();
  const std::string s = out.str();
  EXPECT_EQ(count(s, '\r'), 0u);
  EXPECT_GE(count(s, '\n'), 3u);
  EXPECT_LE(count(s, '\n'), 4u) << s;
  EXPECT_NE(s.rfind("bench  30.00 MiB"), std::string::npos) << s;
}

TEST(Progress, OffPrintsNothingAndShortRunsStaySilent) {
  std::ostringstream out;
  fake_clock c;
  {
    progress_reporter p(progress_reporter::style::off, out, c.fn());
    p.start(10, "x");
    c.t += 5;
    p.advance(10);
  }
  {
    progress_reporter p(progress_reporter::style::terminal, out, c.fn());
    p.start(10, "x");
    c.t += 0.1;
    p.advance(10);
  }
  EXPECT_EQ(out.str(), "");
  EXPECT_EQ(progress_reporter::choose(false, false), progress_reporter::style::off);
  // Tests do not run on a terminal: the default is off, an explicit --progress prints lines.
  if (!::isatty(2)) {
    EXPECT_EQ(progress_reporter::choose(std::nullopt, false), progress_reporter::style::off);
    EXPECT_EQ(progress_reporter::choose(true, true), progress_reporter::style::lines);
  }
}

TEST(Progress, AdvanceFromManyThreads) {
  std::ostringstream out;
  progress_reporter p(progress_reporter::style::lines, out);
  p.start(8000, "t");
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&] {
      for (int k = 0; k < 1000; ++k) p.advance(1);
    });
  for (auto& t : ts) t.join();
  p.update(8000);
  p.finish();
  SUCCEED();
}

TEST(Progress, ControlCharactersInTheLabelAreEscaped) {
  std::ostringstream out;
  fake_clock c;
  progress_reporter p(progress_reporter::style::lines, out, c.fn());
  p.start(10, "a\033[2Jb");
  c.t += 2;
  p.advance(5);
  p.finish();
  EXPECT_EQ(out.str().find('\033'), std::string::npos) << out.str();
}
