// `gdskit bench`: parse, run (one run, a job file, or a sweep), report, and pick the exit code.
#include <unistd.h>

#include <iostream>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_text.hpp"

#include "bench/bench.hpp"
#include "engine/device_profile.hpp"
#include "tools/progress.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::bench {

namespace {

// Progress on stderr (percentage, rate, ETA; rate only for timed runs): on a terminal unless --json/--csv, or
// wherever --progress asks. A stream that is not std::cerr (tests) gets it only when asked.
std::vector<job_result> run_with_progress(const std::vector<job_spec>& jobs, const run_options& opt, const hooks& h,
                                          std::ostream& err, std::string_view label) {
  auto style = progress_reporter::choose(opt.progress, opt.json || opt.csv);
  if (&err != &std::cerr) style = opt.progress.value_or(false) ? progress_reporter::style::lines : progress_reporter::style::off;
  progress_reporter report(style, err);
  hooks hp = h;
  if (!hp.progress && style != progress_reporter::style::off) {
    std::uint64_t total = 0;
    bool timed = false;
    for (const auto& j : jobs) {
      timed = timed || j.seconds > 0;
      total += j.size_bytes * j.threads;  // bounded by check_extent
    }
    report.start(timed ? 0 : total, label);
    hp.progress = [&report](std::uint64_t bytes, double) { report.update(bytes); };
  }
  try {
    auto r = run_jobs(jobs, opt, hp);
    report.finish();
    return r;
  } catch (...) {
    report.finish();
    throw;
  }
}

bool all_ok(const std::vector<job_result>& rs) {
  for (const auto& r : rs)
    if (!r.verify_ok) return false;
  return true;
}

int run_single(const request& req, std::ostream& out, std::ostream& err, const hooks& h) {
  auto results = run_with_progress(req.jobs, req.options, h, err, "bench");
  const bool many = results.size() > 1;
  job_result total = total_of(results);
  if (req.options.json) {
    nlohmann::json j = {{"gdskit_bench", 1}, {"results", nlohmann::json::array()},
                        {"total", many ? to_json(total) : nlohmann::json(nullptr)}, {"sweep", nullptr}};
    for (const auto& r : results) j["results"].push_back(to_json(r));
    out << json_text(j) << "\n";
  } else if (req.options.csv) {
    out << csv_header();
    for (const auto& r : results) out << csv_row(r);
    if (many) out << csv_row(total);
  } else {
    for (const auto& r : results) {
      if (many) out << fmt::format("job {}:\n", r.job.name);
      out << gdsio_line(r) << "\n" << detail_lines(r, req.options.verbose);
    }
    if (many) out << "total of " << results.size() << " concurrent jobs:\n" << gdsio_line(total) << "\n";
  }
  for (const auto& r : results) {
    if (!r.verify_ok) err << fmt::format("gdskit bench: verification failed: {}\n", r.verify_message);
  }
  return all_ok(results) ? 0 : 1;
}

int run_sweep(const request& req, std::ostream& out, std::ostream& err, const hooks& h) {
  const sweep_spec& sw = *req.sweep;
  const job_spec& base = req.jobs.front();
  std::vector<xfer_spec> xfers = sw.xfers.empty() ? std::vector<xfer_spec>{base.xfer} : sw.xfers;
  std::vector<io_size_spec> ios;
  if (sw.io_bytes.empty()) {
    ios.push_back(base.io);
  } else {
    for (auto b : sw.io_bytes) ios.push_back({b, b, 0});
  }
  std::vector<job_spec> points;
  for (const auto& x : xfers)
    for (const auto& io : ios)
      for (unsigned t : sw.threads) {
        job_spec j = base;
        j.xfer = x;
        j.io = io;
        if (!sw.io_bytes.empty()) j.io_flag = "--sweep io";
        j.threads = t;
        j.threads_flag = "--sweep threads";
        j.name = fmt::format("{}-{}-{}", to_string(x.kind), io.max_bytes, t);
        // Reads must fit the file, GPUs must exist, no point may pass the largest file offset: check every point
        // before the first one runs.
        check_extent(j);
        if (!is_write(j.type)) validate(j);
        points.push_back(j);
      }
  if (!req.options.plot.empty()) {
    if (std::string why = plot_precheck(req.options.plot); !why.empty()) {
      throw usage_error(fmt::format("--plot {}: {}", req.options.plot.string(), why));
    }
  }
  std::vector<sweep_row> rows;
  for (const auto& j : points) {
    const std::string label = fmt::format("bench {} ({}/{})", j.name, rows.size() + 1, points.size());
    auto r = run_with_progress({j}, req.options, h, err, label);
    rows.push_back({std::string(to_string(j.xfer.kind)), j.io.max_bytes, std::move(r.front())});
  }
  std::string verdicts = sweep_verdicts(rows, req.options.plateau_gib_s);
  if (req.options.json) {
    nlohmann::json j = {{"gdskit_bench", 1}, {"results", nlohmann::json::array()}, {"total", nullptr}};
    nlohmann::json lines = nlohmann::json::array();
    for (const auto& row : rows) j["results"].push_back(to_json(row.result));
    std::size_t pos = 0;
    while (pos < verdicts.size()) {
      auto nl = verdicts.find('\n', pos);
      lines.push_back(verdicts.substr(pos, nl - pos));
      pos = nl + 1;
    }
    j["sweep"] = {{"threads", sw.threads}, {"verdicts", lines}};
    out << json_text(j) << "\n";
  } else if (req.options.csv) {
    out << csv_header();
    for (const auto& row : rows) out << csv_row(row.result);
  } else {
    for (const auto& row : rows) out << gdsio_line(row.result) << "\n";
    out << "\n" << sweep_table(rows) << "\n" << verdicts;
    if (!rows.empty()) out << fmt::format("path that ran: {}\n", rows.front().result.path_ran);
  }
  if (!req.options.plot.empty()) {
    std::string e = plot_sweep(rows, req.options.plot);
    if (!e.empty()) {
      err << fmt::format("gdskit bench: --plot {}: {}\n", req.options.plot.string(), e);
      return 3;
    }
    if (!req.options.json && !req.options.csv) out << fmt::format("chart: {}\n", req.options.plot.string());
  }
  std::vector<job_result> rs;
  for (const auto& row : rows) rs.push_back(row.result);
  return all_ok(rs) ? 0 : 1;
}

}  // namespace

bool settings_refused(std::ostream& err, std::string_view command) {
  try {
    (void)default_settings();
    return false;
  } catch (const gdskit::error& e) {
    err << command << ": " << e.what() << "\n";  // escaped by the library: not a usage_error, escaped again
    return true;
  }
}

int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, const hooks& h) {
  return run_command([&args] { return parse_args(args); }, out, err, h);
}

int run_command(const std::function<request()>& make_request, std::ostream& out, std::ostream& err, const hooks& h) {
  try {
    request req = make_request();
    if (req.help) {
      out << usage();
      return 0;
    }
    if (settings_refused(err, "gdskit bench")) return 2;
    // A benchmark measures this run alone: shapes learned by earlier runs neither start it nor are written by
    // it (GDSKIT_LEARN included) unless --learn asks for both.
    set_setting("learn", req.options.learn ? "on" : "off");
    const int rc = req.sweep ? run_sweep(req, out, err, h) : run_single(req, out, err, h);
    if (const std::string learned = engine::take_learned_notice(); !learned.empty()) err << learned << "\n";
    return rc;
  } catch (const usage_error& e) {
    err << "gdskit bench: " << printable(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "gdskit bench: " << shown_message(e) << "\n";
    return 3;
  }
}

}  // namespace gdskit::bench
