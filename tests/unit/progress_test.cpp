// The terminal progress reporter: what it prints, how often, and that it leaves a clean line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "tools/progress.hpp"

using gdskit::progress_reporter;

namespace {

struct fake_clock {
  double t = 100.0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

// A reporter writing to a string, on a clock the test moves; started on `total` bytes named `label`.
struct on_fake_clock {
  std::ostringstream out;
  fake_clock c;
  progress_reporter p;
  on_fake_clock(progress_reporter::style s, std::uint64_t total, std::string_view label) : p(s, out, c.fn()) {
    p.start(total, label);
  }
  // `seconds` later, `n` more bytes.
  void step(double seconds, std::uint64_t n) {
    c.t += seconds;
    p.advance(n);
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
  on_fake_clock f(progress_reporter::style::terminal, 1000, "copy");
  f.p.advance(10);
  EXPECT_EQ(f.out.str(), "") << "quiet for the first 0.2 s";
  for (int i = 0; i < 100; ++i) f.step(0.01, 5);  // 100 reports over 1 s
  f.step(1.0, 0);
  f.p.finish();
  f.p.finish();  // idempotent
  const std::string s = f.out.str();
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
  on_fake_clock f(progress_reporter::style::lines, 0, "bench");
  for (int i = 0; i < 30; ++i) f.step(0.1, 1 << 20);
  f.p.finish();
  const std::string s = f.out.str();
  EXPECT_EQ(count(s, '\r'), 0u);
  EXPECT_GE(count(s, '\n'), 3u);
  EXPECT_LE(count(s, '\n'), 4u) << s;
  EXPECT_NE(s.rfind("bench  30.00 MiB"), std::string::npos) << s;
}

TEST(Progress, OffPrintsNothingAndShortRunsStaySilent) {
  on_fake_clock off(progress_reporter::style::off, 10, "x");
  off.step(5, 10);
  off.p.finish();
  on_fake_clock short_run(progress_reporter::style::terminal, 10, "x");
  short_run.step(0.1, 10);
  short_run.p.finish();
  EXPECT_EQ(off.out.str() + short_run.out.str(), "");
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
  on_fake_clock f(progress_reporter::style::lines, 10, "a\033[2Jb");
  f.step(2, 5);
  f.p.finish();
  EXPECT_EQ(f.out.str().find('\033'), std::string::npos) << f.out.str();
}

TEST(Progress, ClearMakesRoomForALineAndTheNextReportRedraws) {
  on_fake_clock f(progress_reporter::style::terminal, 100, "v");
  f.step(1, 50);
  f.p.clear();
  const std::string cleared = f.out.str();
  EXPECT_EQ(cleared.back(), '\r');
  f.out << "result line\n";
  f.step(0.01, 10);  // right after a clear: redrawn at once, not after the 0.2 s period
  EXPECT_NE(f.out.str().find("v   60%", cleared.size()), std::string::npos) << f.out.str();
  f.p.finish();
}
