// Latency percentiles and the queue-depth scaling verdict.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "bench/bench.hpp"

namespace gdskit::bench {

latency_stats summarize_latency(std::vector<std::uint64_t>& ns) {
  latency_stats s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  auto at = [&](double q) {
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ns.size())));
    return static_cast<double>(ns[std::clamp<std::size_t>(rank, 1, ns.size()) - 1]) / 1000.0;
  };
  long double sum = std::accumulate(ns.begin(), ns.end(), 0.0L);
  s.avg_us = static_cast<double>(sum / ns.size() / 1000.0L);
  s.p50_us = at(0.50);
  s.p99_us = at(0.99);
  s.p999_us = at(0.999);
  s.max_us = static_cast<double>(ns.back()) / 1000.0;
  return s;
}

// Thresholds, in one place so docs/bench.md can quote them.
namespace {
constexpr double grows_ratio = 1.5;     // peak / first point: the curve grows with queue depth
constexpr double above_plateau = 1.15;  // peak above the host copy rate by this much: more than a bounce allows
constexpr double near_plateau = 0.80;   // peak within this fraction of the plateau counts as "at" it
constexpr double flat_ratio = 1.10;     // last point / the one before: the curve has stopped growing
}  // namespace

scaling_verdict judge_scaling(std::vector<curve_point> curve, std::optional<double> plateau) {
  scaling_verdict v;
  std::sort(curve.begin(), curve.end(), [](const curve_point& a, const curve_point& b) { return a.threads < b.threads; });
  curve.erase(std::unique(curve.begin(), curve.end(),
                          [](const curve_point& a, const curve_point& b) { return a.threads == b.threads; }),
              curve.end());
  if (curve.empty()) {
    v.text = "no measurements";
    return v;
  }
  auto peak_it = std::max_element(curve.begin(), curve.end(),
                                   [](const curve_point& a, const curve_point& b) { return a.gib_per_s < b.gib_per_s; });
  v.peak_gib_s = peak_it->gib_per_s;
  if (curve.size() < 2) {
    v.text = fmt::format("one thread count only ({:.2f} GiB/s): sweep at least two to judge scaling", v.peak_gib_s);
    return v;
  }
  const double first = curve.front().gib_per_s;
  const double growth = first > 0 ? v.peak_gib_s / first : 0;
  const auto& last = curve.back();
  const auto& before = curve[curve.size() - 2];
  const bool flattened = before.gib_per_s > 0 && last.gib_per_s / before.gib_per_s < flat_ratio;
  const bool grows = growth >= grows_ratio;
  if (plateau && *plateau > 0) {
    const double p = *plateau;
    if (grows && v.peak_gib_s > p * above_plateau) {
      v.kind = verdict_kind::direct;
      v.text = fmt::format(
          "grows with queue depth to {:.2f} GiB/s ({:.1f}x from {} to {} threads), above the host copy rate of "
          "{:.2f} GiB/s: consistent with direct DMA",
          v.peak_gib_s, growth, curve.front().threads, peak_it->threads, p);
    } else if (v.peak_gib_s <= p * above_plateau && v.peak_gib_s >= p * near_plateau && flattened) {
      v.kind = verdict_kind::not_direct;
      v.text = fmt::format("plateaus at the host copy rate ({:.2f} GiB/s against {:.2f} GiB/s): not direct",
                           v.peak_gib_s, p);
    } else if (v.peak_gib_s < p * near_plateau) {
      v.kind = verdict_kind::inconclusive;
      v.text = fmt::format(
          "peaks at {:.2f} GiB/s, below the host copy rate of {:.2f} GiB/s: storage is the limit, so the curve "
          "cannot tell a direct path from a bounce",
          v.peak_gib_s, p);
    } else if (!grows) {
      v.kind = verdict_kind::inconclusive;
      v.text = fmt::format(
          "does not grow with queue depth ({:.2f} GiB/s at {} threads, peak {:.2f} at {}, {:.2f} at {}) against a "
          "host copy rate of {:.2f} GiB/s: no sign of direct DMA, which would grow with depth; the storage sets "
          "this curve",
          first, curve.front().threads, v.peak_gib_s, peak_it->threads, last.gib_per_s, last.threads, p);
    } else {
      v.kind = verdict_kind::inconclusive;
      v.text = fmt::format(
          "peaks at {:.2f} GiB/s ({:.1f}x from {} to {} threads) near the host copy rate of {:.2f} GiB/s without "
          "flattening: inconclusive, sweep more threads",
          v.peak_gib_s, growth, curve.front().threads, peak_it->threads, p);
    }
    return v;
  }
  if (grows) {
    v.kind = verdict_kind::inconclusive;
    v.text = fmt::format(
        "grows with queue depth to {:.2f} GiB/s ({:.1f}x from {} to {} threads); no staged-copy plateau to compare "
        "against (sweep x=staged too, or give --plateau): consistent with direct DMA only if that is above the "
        "host copy rate",
        v.peak_gib_s, growth, curve.front().threads, peak_it->threads);
  } else {
    v.kind = verdict_kind::inconclusive;
    v.text = fmt::format(
        "flat at about {:.2f} GiB/s ({:.1f}x from {} to {} threads): does not grow with queue depth; no staged-copy "
        "plateau to compare against",
        v.peak_gib_s, growth, curve.front().threads, last.threads);
  }
  return v;
}

}  // namespace gdskit::bench
