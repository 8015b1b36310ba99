#include "tools/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "tools/shell_text.hpp"
#include "gdskit/settings.hpp"

namespace gdskit {
namespace {

constexpr double kQuietStartS = 0.2;      // short runs print nothing
constexpr double kTerminalPeriodS = 0.2;  // 5 redraws a second
constexpr double kLinesPeriodS = 1.0;     // one line a second into files and pipes

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<std::uint64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace

progress_reporter::style progress_reporter::choose(std::optional<bool> explicit_choice, bool machine_output) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (explicit_choice) return !*explicit_choice ? style::off : tty ? style::terminal : style::lines;
  return tty && !machine_output ? style::terminal : style::off;
}

progress_reporter::progress_reporter(style s, std::ostream& out, std::function<double()> clock)
    : style_(s), out_(out), clock_(std::move(clock)) {}

progress_reporter::progress_reporter(style s) : progress_reporter(s, std::cerr) {}

progress_reporter::~progress_reporter() { finish(); }

double progress_reporter::now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string progress_reporter::render(std::string_view label, std::uint64_t done, std::uint64_t total, double seconds) {
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  std::string s(label);
  if (total > 0) {
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    s += fmt::format("  {:3.0f}%  {} / {}", frac * 100.0, format_size(done), format_size(total));
  } else {
    s += fmt::format("  {}", format_size(done));
  }
  s += fmt::format("  {}/s", format_size(static_cast<std::uint64_t>(rate)));
  if (total > 0) {
    const std::uint64_t left = done >= total ? 0 : total - done;
    s += "  ETA " + (rate > 0 ? duration_text(static_cast<double>(left) / rate) : std::string("?"));
  }
  return s;
}

void progress_reporter::start(std::uint64_t total_bytes, std::string_view label) {
  std::lock_guard lk(mu_);
  total_ = total_bytes;
  label_ = printable(label);
  done_ = 0;
  start_s_ = now();
  last_draw_s_ = -1;
  active_ = style_ != style::off;
}

void progress_reporter::advance(std::uint64_t nbytes) {
  done_.fetch_add(nbytes, std::memory_order_relaxed);
  maybe_draw(false);
}

void progress_reporter::update(std::uint64_t done_bytes) {
  done_.store(done_bytes, std::memory_order_relaxed);
  maybe_draw(false);
}

void progress_reporter::maybe_draw(bool force) {
  if (!active_) return;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || !active_) return;  // another thread is drawing: this report would be stale anyway
  const double t = now();
  const double elapsed = t - start_s_;
  if (!force) {
    if (elapsed < kQuietStartS) return;
    const double period = style_ == style::terminal ? kTerminalPeriodS : kLinesPeriodS;
    if (last_draw_s_ >= 0 && t - last_draw_s_ < period) return;
  }
  last_draw_s_ = t;
  std::string text = render(label_, done_.load(std::memory_order_relaxed), total_, elapsed);
  if (style_ == style::terminal) {
    // Pad over what the previous report left, then return to the start of the line.
    const std::size_t width = text.size();
    if (width < drawn_width_) text.append(drawn_width_ - width, ' ');
    drawn_width_ = width;
    out_ << '\r' << text << std::flush;
  } else {
    out_ << text << '\n' << std::flush;
  }
  drew_ = true;
}

void progress_reporter::clear() {
  if (!active_ || style_ != style::terminal) return;
  std::lock_guard lk(mu_);
  if (drew_) out_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  drawn_width_ = 0;
  last_draw_s_ = -1;
}

void progress_reporter::finish() {
  if (!active_) return;
  if (style_ == style::lines && drew_) maybe_draw(true);
  std::lock_guard lk(mu_);
  if (style_ == style::terminal && drew_) out_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  active_ = false;
  drew_ = false;
  drawn_width_ = 0;
}

}  // namespace gdskit
