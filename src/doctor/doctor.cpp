#include "doctor/doctor.hpp"

#include <fmt/format.h>

#include "doctor/checks.hpp"

namespace gdskit::doctor {
namespace {

std::string counts_text(const io_path_counts& d) {
  return fmt::format("reads n={} (p2p {}, nvfs {}, posix {}), writes n={} (p2p {}, nvfs {}, posix {})", d.reads,
                     d.p2p_reads, d.nvfs_reads, d.posix_reads, d.writes, d.p2p_writes, d.nvfs_writes, d.posix_writes);
}

// Informational checks (impact none): what the counters, the kernel log and the sweep showed.
void add_probe_evidence(layer& pl, const probe_results& p) {
  if (p.default_read.succeeded()) {
    check k{"probe.data", "Data read back", p.data_verified ? status::ok : status::fail, impact::cufile,
            p.data_verified ? "bytes read equal bytes written" : "bytes read back differ from bytes written", {},
            p.data_verified ? "" : "cuFile returned wrong data: do not use this setup; report it with this output."};
    pl.checks.push_back(std::move(k));
  }
  {
    check k{"probe.cufile_stats", "cuFile per-GPU counters (default config)", status::unknown, impact::none, "", {}, ""};
    if (const auto& d = p.cufile_stats_delta) {
      const std::uint64_t n = d->reads + d->writes, posix = d->posix_reads + d->posix_writes;
      const std::uint64_t direct = d->p2p_reads + d->nvfs_reads + d->p2p_writes + d->nvfs_writes;
      if (n == 0) k.summary = "no cuFile read or write counted: " + counts_text(*d);
      else if (posix >= n) {
        k.state = status::warn;
        k.summary = "compat: posix == n, every request bounced through host memory: " + counts_text(*d);
      } else if (posix == 0 && direct > 0) {
        k.state = status::ok;
        k.summary = "direct: no request went through POSIX: " + counts_text(*d);
      } else {
        k.state = status::warn;
        k.summary = "mixed: some requests went through POSIX: " + counts_text(*d);
      }
    } else {
      k.summary = "not available (cuFile statistics could not be read)";
    }
    if (p.strict_stats_delta) k.evidence.push_back({"strict run", 0, counts_text(*p.strict_stats_delta)});
    pl.checks.push_back(std::move(k));
  }
  if (p.nvfs_reads_delta || p.nvfs_bar1_map_delta) {
    check k{"probe.nvfs_stats", "nvidia-fs counters over the probe", status::ok, impact::none, "", {}, ""};
    k.summary = fmt::format("Reads n +{}, Bar1-map n +{}",
                            p.nvfs_reads_delta ? std::to_string(*p.nvfs_reads_delta) : std::string("?"),
                            p.nvfs_bar1_map_delta ? std::to_string(*p.nvfs_bar1_map_delta) : std::string("?"));
    k.evidence.push_back({"proc/driver/nvidia-fs/stats", 0, "before/after the probe"});
    pl.checks.push_back(std::move(k));
  }
  {
    check k{"probe.dmesg", "Kernel log during the probe", status::ok, impact::none, "", {}, ""};
    bool einval = false;
    for (const auto& l : p.new_dmesg_lines) {
      k.evidence.push_back({"commands/dmesg.txt", 0, l});
      if (l.find("nvidia_p2p") != std::string::npos || l.find("-22") != std::string::npos) einval = true;
    }
    k.summary = p.new_dmesg_lines.empty() ? "no new nvidia-fs / NVRM / nvidia_p2p lines (or dmesg not readable: see notes)"
                                          : fmt::format("{} new line(s)", p.new_dmesg_lines.size());
    if (einval) {
      k.state = status::warn;
      k.fix = "nvidia_p2p -22 (EINVAL): the driver refused the P2P pin of GPU memory (GeForce without the P2P patch: "
              "see gdskit patch).";
    }
    pl.checks.push_back(std::move(k));
  }
  if (!p.sweep.empty()) {
    check k{"probe.sweep", "Queue-depth sweep (default config, reads)", status::ok, impact::none, "", {}, ""};
    std::string s;
    for (const auto& pt : p.sweep)
      s += fmt::format("{}qd {}: {:.2f} GiB/s", s.empty() ? "" : ", ", pt.queue_depth, pt.gib_per_s);
    k.summary = fmt::format("{} ({} KiB requests)", s, p.sweep.front().io_size_bytes / 1024);
    pl.checks.push_back(std::move(k));
  }
  if (!p.notes.empty() || !p.cufile_log_lines.empty()) {
    check k{"probe.notes", "Probe notes and cufile.log", status::ok, impact::none, "", {}, ""};
    k.summary = fmt::format("{} note(s), {} cufile.log line(s)", p.notes.size(), p.cufile_log_lines.size());
    for (const auto& n : p.notes) k.evidence.push_back({"probe", 0, n});
    for (const auto& l : p.cufile_log_lines) k.evidence.push_back({"cufile.log", 0, l});
    pl.checks.push_back(std::move(k));
  }
}

}  // namespace

std::string probe_fix(const std::string& id, int code, const std::string& device) {
  const std::string dev = device.empty() ? std::string("<maj>:<min>") : device;
  switch (code) {
    case 5001:
      if (id.find("strict") != std::string::npos)
        return "No direct path: with compat mode off cuFile refuses to open. Load nvidia-fs with a hooked NVMe "
               "driver, or set up PCI P2PDMA (see the kernel layer above).";
      return "cuFile could not open its driver: check libcufile, the CUDA driver and cufile.log.";
    case 5027:
      return fmt::format("cuFile found no udev data for the file's device: create /run/udev/data/b{} with "
                         "E:ID_FS_USAGE=filesystem and E:ID_FS_TYPE=<fs> (run systemd-udevd, or bind-mount /run/udev "
                         "into the container).",
                         dev);
    case 5008:
    case 5034:
      return "This file system or device is not supported for direct IO (or denied in cufile.json): use a "
             "supported file system (ext4 data=ordered, xfs) on NVMe without dm/md layers.";
    case 5036:
      return "Pinning GPU memory failed: on GeForce the driver refuses the P2P pin (dmesg nvidia_p2p -22); "
             "see gdskit patch.";
    default:
      if (id == "probe.buf_register")
        return "cuFileBufRegister failed: the GPU memory could not be pinned for DMA (dmesg nvidia_p2p -22 on "
               "GeForce without the P2P patch; check BAR1 and max_device_pinned_mem_size_kb).";
      if (code == -1) return "The probe process failed: see its stderr in the notes and cufile.log.";
      return "";
  }
}

std::string default_path(system_root& root) {
  if (root.live()) {
    std::error_code ec;
    auto cwd = std::filesystem::current_path(ec);
    return ec ? std::string("/") : cwd.string();
  }
  auto r = root.command("doctor-path");
  if (r.ok()) {
    std::string p = trim(*r.text);
    if (!p.empty() && p[0] == '/') return p;
  }
  return "/";
}

report diagnose(system_root& root, const std::string& path, std::optional<probe_results> probe) {
  report r;
  r.root = root.root().string();
  r.path = path;
  root.record("commands/doctor-path.txt", path + "\n");
  r.layers = run_checks(root, path);
  r.programs_not_found = root.programs_not_found();
  if (!root.capped().empty() && !r.layers.empty()) {
    // A file cut at its size limit was judged on its first bytes only: say so, next to the logs.
    check c{"inputs.capped", "Files cut at the size limit", status::warn, impact::none,
            fmt::format("{} file(s) larger than the doctor reads were judged on their first bytes only",
                        root.capped().size()),
            {}, ""};
    for (const auto& f : root.capped()) c.evidence.push_back({f, 0, "cut at the size limit"});
    r.layers.back().checks.push_back(std::move(c));
  }
  if (probe) {
    layer pl{"probe", "Live proof (cuFile)", {}};
    check c{"probe.run", "Live probe", status::unknown, impact::none, "", {}, ""};
    if (!probe->ran) {
      c.summary = "not run: " + probe->skipped_reason;
    } else {
      c.state = status::ok;
      c.summary = "ran on " + probe->file + (probe->o_direct ? " (O_DIRECT)" : "");
      if (!probe->strict_config.empty()) c.evidence.push_back({"strict config", 0, probe->strict_config});
    }
    pl.checks.push_back(std::move(c));
    auto step = [&](const char* id, const char* title, const probe_step& s, impact blocks) {
      if (!s.attempted) return;
      check k{id, title, s.succeeded() ? status::ok : status::fail, blocks,
              s.succeeded() ? std::string("ok") : s.message + " (" + std::to_string(s.code) + ")", {},
              s.succeeded() ? std::string() : probe_fix(id, s.code, probe->file_device)};
      pl.checks.push_back(std::move(k));
    };
    step("probe.driver_open", "cuFileDriverOpen (default config)", probe->driver_open_default, impact::cufile);
    step("probe.handle_register", "cuFileHandleRegister", probe->handle_register, impact::cufile);
    step("probe.buf_register", "cuFileBufRegister", probe->buf_register, impact::cufile);
    step("probe.default_write", "write (default config)", probe->default_write, impact::cufile);
    step("probe.default_read", "read (default config)", probe->default_read, impact::cufile);
    step("probe.strict_open", "cuFileDriverOpen (allow_compat_mode=false)", probe->driver_open_strict, impact::direct);
    step("probe.strict_write", "write (allow_compat_mode=false)", probe->strict_write, impact::direct);
    step("probe.strict_read", "read (allow_compat_mode=false)", probe->strict_read, impact::direct);
    if (probe->ran) {
      add_probe_evidence(pl, *probe);
      r.layers.push_back(std::move(pl));
    }
    r.probe = std::move(probe);
  }
  r.result = decide(r.layers, r.probe);
  return r;
}

}  // namespace gdskit::doctor
