// Reporters: the gdsio line, gdskit's fields, JSON, CSV, the sweep table and verdicts, the gnuplot chart.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "common/printable.hpp"
#include "tools/path_line.hpp"
#include "tools/programs.hpp"
#include "tools/signal_cleanup.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::bench {

namespace {

std::string percent(const std::optional<double>& r) {
  return r ? fmt::format("{:.1f}%", *r * 100.0) : std::string("unknown");
}

nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string s;
  for (const auto& x : v) {
    if (x.empty()) continue;
    if (!s.empty()) s += sep;
    s += x;
  }
  return s;
}

std::string csv_field(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

std::string asked(const job_spec& j) {
  if (j.xfer.gdsio_number >= 0) return std::to_string(j.xfer.gdsio_number);
  return j.xfer.stream ? std::string("batch-stream") : std::string(to_string(j.xfer.kind));
}

}  // namespace

std::string gdsio_line(const job_result& r) {
  return fmt::format(
      "IoType: {} XferType: {} Threads: {} DataSetSize: {}/{}(KiB) IOSize: {} Throughput: {:.6f} GiB/sec, "
      "Avg_Latency: {:.6f} usecs ops: {} total_time {:.6f} secs",
      io_label(r.job.type), r.job.xfer.label, r.job.threads, r.bytes / 1024, r.requested_bytes / 1024,
      r.job.io.label(), r.gib_per_s(), r.latency.avg_us, r.ops, r.seconds);
}

std::string detail_lines(const job_result& r, bool verbose) {
  std::string s;
  s += fmt::format("  path:        {} (asked -x {}): {}\n", r.path_ran, asked(r.job),
                   tools::reasons_text(r.reasons, verbose));
  s += fmt::format("  latency:     p50 {:.1f} us, p99 {:.1f} us, p999 {:.1f} us, max {:.1f} us\n", r.latency.p50_us,
                   r.latency.p99_us, r.latency.p999_us, r.latency.max_us);
  s += fmt::format("  cpu:         {:.3f} CPU-s per GiB (user {:.3f} s + sys {:.3f} s)\n", r.cpu_s_per_gib(),
                   r.cpu_user_s, r.cpu_sys_s);
  std::string cache = fmt::format("before {}, after {}", percent(r.residency_before), percent(r.residency_after));
  if (r.cold_asked) {
    if (!r.drop_error.empty()) {
      cache += fmt::format("; not dropped: {}", r.drop_error);
    } else {
      const bool gone = r.residency_after_drop && *r.residency_after_drop < 0.01;
      cache += fmt::format("; --cold: {} ({} resident after DONTNEED)", gone ? "dropped" : "NOT fully dropped",
                           percent(r.residency_after_drop));
    }
  } else if (r.warm_asked) {
    cache += r.warm_error.empty() ? "; --warm: read through the page cache first (before = after warming)"
                                  : fmt::format("; --warm failed: {}", r.warm_error);
  } else {
    cache += "; not dropped (--cold drops it, --warm fills it)";
  }
  if (!r.residency_before && !r.residency_note.empty()) cache += fmt::format(" [{}]", r.residency_note);
  s += fmt::format("  page cache:  {}\n", cache);
  if (!r.created.empty()) {
    std::vector<std::string> names;
    for (const auto& f : r.created) names.push_back(printable(f.string()));
    s += fmt::format("  created:     {}\n", join(names, ", "));
  }
  if (r.verified) {
    s += r.verify_ok ? fmt::format("  verify:      OK, {} bytes checked against the pattern of seed {}\n",
                                   r.verified_bytes, r.job.seed)
                     : fmt::format("  verify:      FAILED: {}\n", r.verify_message);
  }
  s += fmt::format("  cufile:      {}\n", r.cufile_stats);
  return s;
}

namespace {
nlohmann::json cufile_json(const std::optional<cufile_counts>& c) {
  if (!c) return nullptr;
  return {{"reads", c->reads},       {"p2p_reads", c->p2p_reads},   {"nvfs_reads", c->nvfs_reads},
          {"posix_reads", c->posix_reads}, {"writes", c->writes}, {"p2p_writes", c->p2p_writes},
          {"nvfs_writes", c->nvfs_writes}, {"posix_writes", c->posix_writes},
          {"path", std::string(cufile_path_of(*c))}, {"shared", c->shared}};
}
}  // namespace

nlohmann::json to_json(const job_result& r) {
  using nlohmann::json;
  json files = json::array();
  for (const auto& f : r.created) files.push_back(f.string());
  json j = {
      {"job", r.job.name},
      {"io_type", std::string(io_label(r.job.type))},
      {"xfer_type", r.job.xfer.label},
      {"xfer_asked", asked(r.job)},
      {"threads", r.job.threads},
      {"dataset_kib", r.bytes / 1024},
      {"requested_kib", r.requested_bytes / 1024},
      {"io_size", {{"min_bytes", r.job.io.min_bytes}, {"max_bytes", r.job.io.max_bytes}, {"step_bytes", r.job.io.step_bytes}}},
      {"throughput_gib_s", r.gib_per_s()},
      {"avg_latency_us", r.latency.avg_us},
      {"ops", r.ops},
      {"total_time_s", r.seconds},
      {"bytes", r.bytes},
      {"path", {{"ran", r.path_ran}, {"reasons", r.reasons}}},
      {"latency_us", {{"avg", r.latency.avg_us}, {"p50", r.latency.p50_us}, {"p99", r.latency.p99_us},
                      {"p999", r.latency.p999_us}, {"max", r.latency.max_us}}},
      {"cpu", {{"user_s", r.cpu_user_s}, {"sys_s", r.cpu_sys_s}, {"s_per_gib", r.cpu_s_per_gib()}}},
      {"page_cache", {{"before", opt_json(r.residency_before)}, {"after", opt_json(r.residency_after)},
                      {"cold", r.cold_asked}, {"warm", r.warm_asked}, {"after_drop", opt_json(r.residency_after_drop)},
                      {"drop_error", r.drop_error}, {"note", r.residency_note}}},
      {"created", files},
      // A verification that did not run (no -V) has no verdict: ok is null, never a pass.
      {"verify",
       {{"ran", r.verified},
        {"ok", r.verified ? json(r.verify_ok) : json(nullptr)},
        {"bytes", r.verified_bytes},
        {"message", r.verify_message}}},
      {"cufile_stats", r.cufile_stats},
      {"cufile_counters", cufile_json(r.cufile_counters)},
  };
  if (r.routes) {
    j["batch"] = {{"ranges_per_batch", batch_ranges(r.job)},
                  {"batches", r.routes->batches},
                  {"stream_ordered", r.job.xfer.stream},
                  {"ranges_by_route", {{"host", r.routes->host}, {"staged", r.routes->staged}, {"gds", r.routes->gds}}},
                  {"file_requests", r.routes->requests},
                  {"buffered_requests", r.routes->buffered}};
  }
  return j;
}

std::string csv_header() {
  return "job,io_type,xfer_type,xfer_asked,path,threads,io_min_bytes,io_max_bytes,bytes,requested_bytes,ops,"
         "total_time_s,throughput_gib_s,avg_latency_us,p50_us,p99_us,p999_us,cpu_s_per_gib,cache_before,cache_after,"
         "cold,verify\n";
}

std::string csv_row(const job_result& r) {
  auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : std::string(); };
  return fmt::format("{},{},{},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f},{},{},{},{}\n",
                     csv_field(r.job.name), io_label(r.job.type), r.job.xfer.label, asked(r.job), r.path_ran,
                     r.job.threads, r.job.io.min_bytes, r.job.io.max_bytes, r.bytes, r.requested_bytes, r.ops,
                     r.seconds, r.gib_per_s(), r.latency.avg_us, r.latency.p50_us, r.latency.p99_us,
                     r.latency.p999_us, r.cpu_s_per_gib(), opt(r.residency_before), opt(r.residency_after),
                     r.cold_asked ? 1 : 0, !r.verified ? "" : (r.verify_ok ? "ok" : "failed"));
}

std::string sweep_table(const std::vector<sweep_row>& rows) {
  std::string s = fmt::format("{:<8} {:>10} {:>8} {:>12} {:>10} {:>10} {:>10} {:>12}\n", "path", "io_size", "threads",
                              "GiB/s", "avg_us", "p99_us", "p999_us", "cpu_s/GiB");
  for (const auto& row : rows) {
    const auto& r = row.result;
    s += fmt::format("{:<8} {:>10} {:>8} {:>12.3f} {:>10.1f} {:>10.1f} {:>10.1f} {:>12.3f}\n", row.xfer,
                     format_size(row.io_bytes), r.job.threads, r.gib_per_s(), r.latency.avg_us, r.latency.p99_us,
                     r.latency.p999_us, r.cpu_s_per_gib());
  }
  return s;
}

namespace {

// Curves keyed by (path, io size) in first-seen order.
std::vector<std::pair<std::pair<std::string, std::uint64_t>, std::vector<curve_point>>> curves_of(
    const std::vector<sweep_row>& rows) {
  std::vector<std::pair<std::pair<std::string, std::uint64_t>, std::vector<curve_point>>> out;
  for (const auto& row : rows) {
    auto key = std::make_pair(row.xfer, row.io_bytes);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.first == key; });
    if (it == out.end()) {
      out.push_back({key, {}});
      it = out.end() - 1;
    }
    it->second.push_back({row.result.job.threads, row.result.gib_per_s()});
  }
  return out;
}

}  // namespace

std::string sweep_verdicts(const std::vector<sweep_row>& rows, std::optional<double> plateau) {
  auto curves = curves_of(rows);
  std::optional<double> ref = plateau;
  std::string ref_from = "--plateau";
  if (!ref) {
    // The staged-copy plateau: the best a path that bounces through host memory reached in this sweep.
    for (const auto& [key, pts] : curves) {
      if (key.first != "staged" && key.first != "naive") continue;
      for (const auto& p : pts) {
        if (!ref || p.gib_per_s > *ref) {
          ref = p.gib_per_s;
          ref_from = key.first + " curve of this sweep";
        }
      }
    }
  }
  std::string s;
  for (const auto& [key, pts] : curves) {
    const bool bounce = key.first == "staged" || key.first == "naive" || key.first == "host";
    scaling_verdict v = judge_scaling(pts, bounce ? std::nullopt : ref);
    std::string what = v.text;
    if (key.first == "host") {
      what = fmt::format("host memory, no GPU copy: peaks at {:.2f} GiB/s (the file read rate: storage, or the page "
                         "cache when warm)", v.peak_gib_s);
    } else if (bounce) {
      what = fmt::format("bounces through host memory by construction: peaks at {:.2f} GiB/s (the host copy rate)",
                         v.peak_gib_s);
    }
    s += fmt::format("verdict {} io {}: {}{}\n", key.first, format_size(key.second), what,
                     !bounce && ref ? fmt::format(" [plateau from {}]", ref_from) : std::string());
  }
  return s;
}

std::string plot_precheck(const std::filesystem::path& png) {
  const std::filesystem::path dir = png.parent_path().empty() ? std::filesystem::path(".") : png.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return fmt::format("folder {} does not exist", dir.string());
  if (tools::find_program("gnuplot")) return {};
  return fmt::format("gnuplot is not in {} (Debian: apt-get install gnuplot-nox); drop --plot, or use --csv and "
                     "draw elsewhere", tools::searched_dirs());
}

std::string plot_sweep(const std::vector<sweep_row>& rows, const std::filesystem::path& png) {
  auto curves = curves_of(rows);
  // A fresh private folder (mkdtemp), not a guessable name another user could have made first.
  std::string tmpl = (std::filesystem::temp_directory_path() / "gdskit-plot-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return fmt::format("cannot create {}: {}", tmpl, std::strerror(errno));
  const std::filesystem::path dir = tmpl;
  std::error_code ec;
  // Interrupted while gnuplot draws: the data, the script and then the folder are removed (signal_cleanup).
  std::vector<remove_on_signal> remove_if_interrupted;
  remove_if_interrupted.emplace_back(dir);
  std::string plot_cmd;
  int idx = 0;
  for (const auto& [key, pts] : curves) {
    auto data = dir / fmt::format("curve{}.dat", idx);
    remove_if_interrupted.emplace_back(data);
    std::ofstream d(data);
    for (const auto& p : pts) d << p.threads << ' ' << p.gib_per_s << '\n';
    if (!plot_cmd.empty()) plot_cmd += ", ";
    plot_cmd += fmt::format("'{}' using 1:2 with linespoints title '{} io {}'", data.string(), key.first,
                            format_size(key.second));
    ++idx;
  }
  auto script = dir / "plot.gp";
  remove_if_interrupted.emplace_back(script);
  {
    std::ofstream g(script);
    std::string out = png.string();
    // gnuplot strings in single quotes: a quote in the path is doubled.
    std::string quoted;
    for (char c : out) quoted += c == '\'' ? std::string("''") : std::string(1, c);
    g << "set terminal pngcairo size 900,560 noenhanced\n"
      << "set output '" << quoted << "'\n"
      << "set title 'gdskit bench: throughput against queue depth'\n"
      << "set xlabel 'threads (requests in flight)'\nset ylabel 'GiB/s'\nset logscale x 2\nset grid\n"
      << "set key left top\nset yrange [0:*]\n"
      << "plot " << plot_cmd << "\n";
  }
  const auto gnuplot = tools::find_program("gnuplot");
  std::error_code run_ec = std::make_error_code(std::errc::no_such_file_or_directory);
  if (gnuplot) {
    run_ec = tools::run_program(*gnuplot, {script.string()}, -1, tools::stderr_mode::discard,
                                [](const char*, std::size_t) { return std::error_code{}; });
  }
  std::filesystem::remove_all(dir, ec);
  if (!gnuplot) return fmt::format("gnuplot not found in {} (Debian: apt-get install gnuplot-nox)", tools::searched_dirs());
  if (run_ec == std::errc::io_error) return "gnuplot failed to draw the chart";
  if (run_ec) return fmt::format("gnuplot could not be run: {}", run_ec.message());
  return {};
}

}  // namespace gdskit::bench
