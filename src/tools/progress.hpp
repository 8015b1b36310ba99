// Progress of a long transfer on a terminal: percentage, rate and time left, on one line of stderr.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace gdskit {

/// Reports progress as "label  42%  1.50 GiB / 3.50 GiB  1.20 GiB/s  ETA 2s".
///   progress_reporter p(progress_reporter::choose(flag, json));
///   p.start(total_bytes, "load");  ...  p.advance(n);  ...  p.finish();
/// On a terminal the line is redrawn in place at most 5 times a second and cleared by finish(); when asked for on
/// something else (a file, a pipe) it writes one line a second and a last line at finish(). advance() and update()
/// may be called from any thread. Nothing is printed for the first 0.2 s, so short runs stay silent.
class progress_reporter {
 public:
  enum class style { off, terminal, lines };

  /// The style for stderr: `explicit_choice` (--progress / --no-progress) wins; otherwise progress is shown only
  /// when stderr is a terminal and the output is not machine-readable (`machine_output`: --json, --csv).
  static style choose(std::optional<bool> explicit_choice, bool machine_output);

  /// `clock` returns seconds (a steady clock when empty; tests pass their own). `out` must outlive the reporter.
  explicit progress_reporter(style s, std::ostream& out, std::function<double()> clock = {});
  /// Writes to std::cerr.
  explicit progress_reporter(style s);
  ~progress_reporter();
  progress_reporter(const progress_reporter&) = delete;
  progress_reporter& operator=(const progress_reporter&) = delete;

  /// Begins a transfer of `total_bytes` (0: unknown, then no percentage and no ETA) named `label`.
  void start(std::uint64_t total_bytes, std::string_view label);
  /// `nbytes` more are done.
  void advance(std::uint64_t nbytes);
  /// `done_bytes` are done in all (for callers that count themselves).
  void update(std::uint64_t done_bytes);
  /// Blanks the line on a terminal so that the caller can print a line of its own; the next report redraws it.
  void clear();
  /// Ends the line: clears it on a terminal, prints the last state otherwise. Idempotent; the destructor calls it.
  void finish();

  /// The text of one report (no line ending), for `done` of `total` bytes after `seconds`.
  static std::string render(std::string_view label, std::uint64_t done, std::uint64_t total, double seconds);

 private:
  void maybe_draw(bool force);
  double now() const;

  style style_;
  std::ostream& out_;
  std::function<double()> clock_;
  std::mutex mu_;
  std::atomic<std::uint64_t> done_{0};
  std::uint64_t total_ = 0;
  std::string label_;
  double start_s_ = 0, last_draw_s_ = -1;
  std::size_t drawn_width_ = 0;
  std::atomic<bool> active_{false};
  bool drew_ = false;
};

}  // namespace gdskit
