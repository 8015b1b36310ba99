// The live cuFile proof. The doctor process itself never opens the cuFile driver: each configuration runs
// in a probe process (the gdskit binary again, `doctor --probe-child`), because cuFile reads its
// configuration once per process and a crash inside the library must become evidence, not the doctor's end.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <cctype>
#include <charconv>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "posix/bounded_read.hpp"
#include "tools/programs.hpp"
#include "doctor/probe.hpp"
#include "gdskit/buffer.hpp"
#include "shim/cufile.hpp"

extern char** environ;

namespace gdskit::doctor {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p, std::size_t cap = 4u << 20) { return read_bounded(p, cap).text.value_or(""); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string tail(const std::string& s, std::size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// dmesg, or nullopt with a note (restricted buffer: EPERM for non-root with kernel.dmesg_restrict=1).
std::optional<std::string> read_dmesg(std::string& note) {
  const auto dmesg = tools::find_program("dmesg");
  if (!dmesg) {
    note = "dmesg not found in " + tools::searched_dirs();
    return std::nullopt;
  }
  auto out = tools::run_captured(*dmesg, {}, 16u << 20);
  if (out.error && out.error != std::errc::io_error) {
    note = fmt::format("dmesg could not be run: {}", out.error.message());
    return std::nullopt;
  }
  if (out.error) {
    note = out.text.find("not permitted") != std::string::npos
               ? "dmesg not readable (EPERM: kernel.dmesg_restrict=1); run as root to see nvidia_p2p/nvidia-fs lines"
               : "dmesg failed: " + tail(out.text, 200);
    return std::nullopt;
  }
  return std::move(out.text);
}

std::optional<nvfs_counters> read_nvfs() {
  std::error_code ec;
  if (!fs::exists("/proc/driver/nvidia-fs/stats", ec)) return std::nullopt;
  return parse_nvfs_stats(slurp("/proc/driver/nvidia-fs/stats"));
}

std::string effective_cufile_json(std::string& where) {
  if (const char* e = std::getenv("CUFILE_ENV_PATH_JSON"); e != nullptr && *e != '\0') {
    where = e;
    return slurp(e);
  }
  where = "/etc/cufile.json";
  return slurp(where);
}

bool write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

std::string signal_text(int sig) {
  const char* s = ::strsignal(sig);
  return fmt::format("killed by signal {} ({})", sig, s != nullptr ? s : "?");
}

// The first failure among a child's steps, for a read that was never reached.
probe_step first_failure(const child_report& c) {
  for (const probe_step* s : {&c.cuda_init, &c.driver_open, &c.handle_register, &c.write, &c.read})
    if (s->attempted && !s->succeeded()) return *s;
  return {};
}

probe_step reached_or(const probe_step& s, const child_report& c, const char* what) {
  if (s.attempted) return s;
  probe_step f = first_failure(c);
  if (!f.attempted) return s;
  f.message = fmt::format("{} not reached: {}", what, f.message);
  return f;
}

void collect_log(probe_results& r, const fs::path& log, const std::string& label) {
  int kept = 0;
  for (const auto& l : lines_of(slurp(log))) {
    if (l.find(" ERROR ") == std::string::npos && l.find(" NOTICE ") == std::string::npos &&
        l.find(" WARN ") == std::string::npos)
      continue;
    if (++kept > 12) {
      r.cufile_log_lines.push_back(label + ": ...");
      break;
    }
    r.cufile_log_lines.push_back(label + ": " + l);
  }
}

}  // namespace

nvfs_counters parse_nvfs_stats(const std::string& text) {
  nvfs_counters c;
  for (const auto& l : lines_of(text)) {
    auto colon = l.find(':');
    if (colon == std::string::npos) continue;
    std::string key = l.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string rest = l.substr(colon + 1);
    // The first "n=<digits>" that starts a word.
    std::optional<std::uint64_t> found;
    for (auto p = rest.find("n="); p != std::string::npos && !found; p = rest.find("n=", p + 1)) {
      const bool word_start = p == 0 || !(std::isalnum(static_cast<unsigned char>(rest[p - 1])) || rest[p - 1] == '_');
      std::uint64_t v = 0;
      auto [end, ec] = std::from_chars(rest.data() + p + 2, rest.data() + rest.size(), v);
      if (word_start && ec == std::errc() && end != rest.data() + p + 2) found = v;
    }
    if (!found) continue;
    const std::uint64_t v = *found;
    if (key == "Reads" && !c.reads) c.reads = v;
    else if (key == "Bar1-map" && !c.bar1_maps) c.bar1_maps = v;
  }
  return c;
}

std::vector<std::string> new_gds_dmesg_lines(const std::string& before, const std::string& after) {
  std::map<std::string, int> seen;
  for (const auto& l : lines_of(before)) ++seen[l];
  std::vector<std::string> out;
  for (const auto& l : lines_of(after)) {
    auto it = seen.find(l);
    if (it != seen.end() && it->second > 0) {
      --it->second;
      continue;
    }
    if (l.find("nvidia-fs") != std::string::npos || l.find("nvidia_fs") != std::string::npos ||
        l.find("NVRM") != std::string::npos || l.find("nvidia_p2p") != std::string::npos ||
        l.find("p2pdma") != std::string::npos)
      out.push_back(l);
  }
  return out;
}

std::string strict_cufile_json(const std::string& system_json) {
  // Only a document that says allow_compat_mode on an uncommented line is edited in place.
  bool present = false;
  for (const auto& l : lines_of(system_json)) {
    auto k = l.find("\"allow_compat_mode\"");
    auto c = l.find("//");
    if (k != std::string::npos && (c == std::string::npos || c > k)) present = true;
  }
  if (present) {
    // Every `"allow_compat_mode" : true|false` becomes false; the rest of the document is kept byte for byte.
    static constexpr std::string_view key = "\"allow_compat_mode\"";
    std::string out;
    std::size_t pos = 0;
    for (auto k = system_json.find(key); k != std::string::npos; k = system_json.find(key, pos)) {
      std::size_t i = k + key.size();
      auto skip_ws = [&] {
        while (i < system_json.size() && (system_json[i] == ' ' || system_json[i] == '\t' || system_json[i] == '\n' ||
                                          system_json[i] == '\r'))
          ++i;
      };
      skip_ws();
      if (i < system_json.size() && system_json[i] == ':') {
        ++i;
        skip_ws();
        for (std::string_view word : {"true", "false"}) {
          if (system_json.compare(i, word.size(), word) == 0) {
            out.append(system_json, pos, i - pos);
            out += "false";
            i += word.size();
            pos = i;
            break;
          }
        }
      }
      if (pos < i) {
        out.append(system_json, pos, i - pos);
        pos = i;
      }
    }
    out.append(system_json, pos, std::string::npos);
    return out;
  }
  bool p2pdma = false;
  for (const auto& l : lines_of(system_json)) {
    auto k = l.find("\"use_pci_p2pdma\"");
    auto c = l.find("//");
    if (k != std::string::npos && (c == std::string::npos || c > k) && l.find("true", k) != std::string::npos) p2pdma = true;
  }
  return fmt::format("{{\n  \"properties\": {{\n    \"allow_compat_mode\": false,\n    \"use_pci_p2pdma\": {}\n  }}\n}}\n",
                     p2pdma ? "true" : "false");
}

child_outcome spawn_probe_child(const fs::path& exe, const std::string& mode, const fs::path& file, std::uint64_t bytes,
                                const std::vector<int>& queue_depths, const std::vector<std::string>& env,
                                const fs::path& scratch_dir, int timeout_s) {
  child_outcome out;
  // "--option=value": a file name that starts with '-' stays a value.
  std::vector<std::string> args{exe.string(),         "doctor", "--probe-child=" + mode, "--probe-file=" + file.string(),
                                "--probe-bytes=" + std::to_string(bytes)};
  if (!queue_depths.empty()) {
    std::string q;
    for (int d : queue_depths) q += (q.empty() ? "" : ",") + std::to_string(d);
    args.push_back("--probe-qd=" + q);
  }
  // Environment: ours, with the given entries replacing same-named ones.
  std::vector<std::string> envs;
  auto name_of = [](const std::string& e) { return e.substr(0, e.find('=')); };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string s(*e);
    bool replaced = false;
    for (const auto& x : env)
      if (name_of(x) == name_of(s)) replaced = true;
    if (!replaced) envs.push_back(s);
  }
  for (const auto& x : env)
    if (x.find('=') != std::string::npos && x.back() != '=') envs.push_back(x);  // "NAME=" removes NAME
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);

  const fs::path out_file = scratch_dir / (mode + ".stdout");
  const fs::path err_file = scratch_dir / (mode + ".stderr");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);  // a libcufile error path closes fd 0
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    out.failure = fmt::format("could not start the probe process {}: {}", exe.string(), std::strerror(rc));
    return out;
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool timed_out = false;
  for (;;) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      out.failure = fmt::format("waitpid: {}", std::strerror(errno));
      return out;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  out.stderr_tail = tail(slurp(err_file), 2000);
  std::string why;
  out.report = parse_child_report(slurp(out_file), &why);
  // A complete report stands even when the process died afterwards (in library teardown at exit).
  std::string ended;
  if (timed_out) ended = fmt::format("probe process ({}) did not finish within {} s and was killed", mode, timeout_s);
  else if (WIFSIGNALED(status)) ended = fmt::format("probe process ({}) {}", mode, signal_text(WTERMSIG(status)));
  if (out.report) {
    if (!ended.empty()) out.note = ended + " after writing its report";
  } else {
    out.failure = !ended.empty() ? ended : fmt::format("probe process ({}) exited with status {}: {}", mode, WEXITSTATUS(status), why);
  }
  return out;
}

probe_results run_live_probe(const probe_options& options) {
  probe_results r;
  const std::string stem = fmt::format(".gdskit-doctor-probe-{}", ::getpid());
  r.file = (options.dir / (stem + "-{strict,default}")).string();
  try {
    std::string why;
    if (!gpu_available(&why)) {
      r.skipped_reason = "no usable GPU: " + why;
      return r;
    }
    if (shim::cufile(&why) == nullptr) {
      r.skipped_reason = why;
      return r;
    }
    std::error_code ec;
    if (!fs::is_directory(options.dir, ec)) {
      r.skipped_reason = fmt::format("--path {} is not a folder (the probe writes its test file there)", options.dir.string());
      return r;
    }
    if (::access(options.dir.c_str(), W_OK) != 0) {
      r.skipped_reason = fmt::format("--path {} is not writable ({}): the probe needs to write a test file there; "
                                     "pick a folder on the storage to test with --path",
                                     options.dir.string(), std::strerror(errno));
      return r;
    }
    if (::access(options.self_exe.c_str(), X_OK) != 0) {
      r.skipped_reason = fmt::format("cannot re-run the gdskit binary {}: {}", options.self_exe.string(), std::strerror(errno));
      return r;
    }
    // Private scratch: the strict configuration and each process's cufile.log and output (cuFile would
    // otherwise write cufile.log into the current folder).
    std::string tmpl = (fs::temp_directory_path(ec) / "gdskit-doctor-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      r.skipped_reason = fmt::format("cannot create a scratch folder {}: {}", tmpl, std::strerror(errno));
      return r;
    }
    const fs::path scratch = tmpl;
    struct remove_all_guard {
      fs::path p;
      ~remove_all_guard() {
        std::error_code e;
        fs::remove_all(p, e);
      }
    } scratch_guard{scratch};

    std::string where;
    const std::string system_json = effective_cufile_json(where);
    const fs::path strict_json = scratch / "cufile-strict.json";
    if (!write_text(strict_json, strict_cufile_json(system_json))) {
      r.skipped_reason = "cannot write the private strict cufile.json in " + scratch.string();
      return r;
    }
    r.strict_config = system_json.empty() ? "minimal document (no readable " + where + "), allow_compat_mode=false"
                                          : where + " with allow_compat_mode=false";

    auto nvfs0 = read_nvfs();
    std::string dmesg_note;
    auto dmesg0 = read_dmesg(dmesg_note);

    r.ran = true;
    const fs::path strict_file = options.dir / (stem + "-strict");
    const fs::path default_file = options.dir / (stem + "-default");
    child_outcome strict = spawn_probe_child(
        options.self_exe, "strict", strict_file, options.file_bytes, {},
        {"CUFILE_ENV_PATH_JSON=" + strict_json.string(), "CUFILE_ALLOW_COMPAT_MODE=false", "CUFILE_FORCE_COMPAT_MODE=",
         "CUFILE_LOGFILE_PATH=" + (scratch / "strict-cufile.log").string(), "CUFILE_LOGGING_LEVEL=NOTICE"},
        scratch, options.timeout_s);
    fs::remove(strict_file, ec);
    child_outcome deflt = spawn_probe_child(
        options.self_exe, "default", default_file, options.file_bytes, options.queue_depths,
        {"CUFILE_LOGFILE_PATH=" + (scratch / "default-cufile.log").string(), "CUFILE_LOGGING_LEVEL=NOTICE"}, scratch,
        options.timeout_s);
    fs::remove(default_file, ec);

    auto nvfs1 = read_nvfs();
    std::string dmesg_note1;
    auto dmesg1 = read_dmesg(dmesg_note1);

    // Strict configuration.
    if (strict.report) {
      const child_report& c = *strict.report;
      r.driver_open_strict = c.cuda_init.succeeded() ? c.driver_open : c.cuda_init;
      r.strict_write = c.write;
      r.strict_read = reached_or(c.read, c, "strict read");
      r.strict_stats_delta = c.stats;
      for (const auto& n : c.notes) r.notes.push_back("strict: " + n);
      if (!strict.note.empty()) r.notes.push_back(strict.note);
    } else {
      r.driver_open_strict = {true, -1, strict.failure};
      r.strict_read = r.driver_open_strict;
      if (!strict.stderr_tail.empty()) r.notes.push_back("strict: stderr: " + strict.stderr_tail);
    }
    // Default configuration.
    if (deflt.report) {
      const child_report& c = *deflt.report;
      r.cuda_init = c.cuda_init;
      r.driver_open_default = c.cuda_init.succeeded() ? c.driver_open : c.cuda_init;
      r.handle_register = c.handle_register;
      r.buf_register = c.buf_register;
      r.default_write = c.write;
      r.default_read = reached_or(c.read, c, "read");
      r.data_verified = c.verified;
      r.cufile_stats_delta = c.stats;
      r.sweep = c.sweep;
      r.file_device = c.file_device;
      r.o_direct = c.o_direct;
      for (const auto& n : c.notes) r.notes.push_back("default: " + n);
      if (!deflt.note.empty()) r.notes.push_back(deflt.note);
    } else {
      r.driver_open_default = {true, -1, deflt.failure};
      r.default_read = r.driver_open_default;
      if (!deflt.stderr_tail.empty()) r.notes.push_back("default: stderr: " + deflt.stderr_tail);
    }
    if (r.file_device.empty() && strict.report) r.file_device = strict.report->file_device;

    if (nvfs0 && nvfs1) {
      if (nvfs0->reads && nvfs1->reads) r.nvfs_reads_delta = *nvfs1->reads - std::min(*nvfs1->reads, *nvfs0->reads);
      else r.notes.push_back("nvidia-fs read counters are off (rw_stats_enabled=0): echo 1 > /sys/module/nvidia_fs/parameters/rw_stats_enabled");
      if (nvfs0->bar1_maps && nvfs1->bar1_maps) r.nvfs_bar1_map_delta = *nvfs1->bar1_maps - std::min(*nvfs1->bar1_maps, *nvfs0->bar1_maps);
    } else {
      r.notes.push_back("no /proc/driver/nvidia-fs/stats (nvidia-fs not loaded): no kernel-side counters");
    }
    if (dmesg0 && dmesg1) r.new_dmesg_lines = new_gds_dmesg_lines(*dmesg0, *dmesg1);
    else r.notes.push_back(!dmesg_note.empty() ? dmesg_note : dmesg_note1);

    collect_log(r, scratch / "strict-cufile.log", "strict");
    collect_log(r, scratch / "default-cufile.log", "default");
  } catch (const std::exception& e) {
    // The probe's own failure is reported, not thrown: the static checks still stand.
    if (!r.ran) r.skipped_reason = fmt::format("probe setup failed: {}", e.what());
    else r.notes.push_back(fmt::format("probe stopped: {}", e.what()));
  }
  return r;
}

}  // namespace gdskit::doctor
