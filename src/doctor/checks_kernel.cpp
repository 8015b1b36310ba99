// Kernel layer: IOMMU, nvidia-fs, the NVMe nvfs hook, the nvidia_p2p exports and the PCI P2PDMA route.
#include <fmt/format.h>

#include <algorithm>

#include "doctor/checks.hpp"

namespace gdskit::doctor {
namespace {

// First line containing `needle` as a whole word-ish token; 1-based line number, 0 when absent.
std::pair<int, std::string> find_line(const std::string& text, const std::string& needle) {
  auto lines = split_lines(text);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    auto pos = lines[i].find(needle);
    if (pos == std::string::npos) continue;
    auto end = pos + needle.size();
    bool word_end = end == lines[i].size() || lines[i][end] == ' ' || lines[i][end] == '\t' || lines[i][end] == '\n';
    bool word_start = pos == 0 || lines[i][pos - 1] == ' ' || lines[i][pos - 1] == '\t';
    if (word_end && word_start) return {static_cast<int>(i + 1), trim(lines[i])};
  }
  return {0, {}};
}

std::vector<std::string> cmdline_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::string tok;
  for (char c : s + " ") {
    if (c == ' ' || c == '\n' || c == '\t') {
      if (!tok.empty()) out.push_back(tok);
      tok.clear();
    } else {
      tok += c;
    }
  }
  return out;
}

}  // namespace

layer check_kernel(system_root& root, facts& f) {
  layer out{"kernel", "Kernel", {}};

  {
    check c{"kernel.release", "Kernel release", status::ok, impact::none, "", {}, ""};
    auto r = root.read("proc/sys/kernel/osrelease");
    if (r.ok() && !trim(*r.text).empty()) {
      c.summary = trim(*r.text);
      c.evidence.push_back({"proc/sys/kernel/osrelease", 1, c.summary});
    } else {
      c.state = status::unknown;
      c.summary = "kernel release not readable";
    }
    out.checks.push_back(std::move(c));
  }

  // IOMMU: translated DMA breaks peer-to-peer between the NVMe and GPU BAR1 on x86.
  {
    check c{"kernel.iommu", "IOMMU", status::unknown, impact::direct, "", {}, ""};
    auto cmd = root.read("proc/cmdline");
    std::string mode;  // "on", "off", "pt"
    if (cmd.ok()) {
      for (const auto& t : cmdline_tokens(*cmd.text)) {
        if (t == "--") break;  // the rest belongs to init
        if (t == "iommu=pt" || t == "iommu.passthrough=1") mode = "pt";
        else if (t == "iommu=off" || t == "intel_iommu=off" || t == "amd_iommu=off") mode = mode == "pt" ? mode : "off";
        else if (t == "intel_iommu=on" || t == "amd_iommu=on" || t == "iommu=on" || t == "iommu=force") {
          if (mode.empty()) mode = "on";
        }
        if (t.find("iommu") != std::string::npos) c.evidence.push_back({"proc/cmdline", 1, t});
      }
    }
    auto groups = root.command("iommu_groups");
    std::optional<std::size_t> ngroups;
    if (groups.ok()) {
      std::size_t n = 0;
      for (const auto& l : split_lines(*groups.text)) {
        auto t = trim(l);
        // Group folders are named by number; anything else (ls headers, errors, junk) is not a group.
        if (!t.empty() && parse_u64(t.substr(t.find_last_of(' ') == std::string::npos ? 0 : t.find_last_of(' ') + 1))) ++n;
      }
      ngroups = n;
      c.evidence.push_back({"commands/iommu_groups.txt", 0, fmt::format("{} IOMMU group(s)", n)});
    } else {
      std::error_code ec;
      auto names = root.list("sys/kernel/iommu_groups", ec);
      if (!ec || ec == std::errc::no_such_file_or_directory) {
        ngroups = names.size();
        c.evidence.push_back({"sys/kernel/iommu_groups", 0, fmt::format("{} IOMMU group(s)", names.size())});
      }
    }
    if (!ngroups && !cmd.ok()) {
      c.summary = "IOMMU state not readable";
    } else if (ngroups && *ngroups > 0 && mode != "pt" && mode != "off") {
      c.state = status::fail;
      c.summary = fmt::format("IOMMU on ({} groups, translated DMA): NVMe-to-GPU P2P DMA is blocked or remapped", *ngroups);
      c.fix = "Add intel_iommu=off (Intel) or amd_iommu=off (AMD), or iommu=pt, to the kernel command line "
              "(GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub) and reboot.";
    } else if (mode == "pt") {
      c.state = status::ok;
      c.summary = "IOMMU in passthrough mode (iommu=pt)";
    } else {
      c.state = status::ok;
      c.summary = ngroups && *ngroups == 0 ? "no IOMMU groups: DMA is not translated" : "IOMMU off on the command line";
    }
    out.checks.push_back(std::move(c));
  }

  // nvidia-fs.
  auto modules = root.read("proc/modules");
  bool nvfs_loaded = false;
  {
    check c{"kernel.nvidia_fs", "nvidia-fs module", status::unknown, impact::direct, "", {}, ""};
    auto ver = root.read("proc/driver/nvidia-fs/version");
    if (modules.ok()) {
      auto [line, text] = find_line(*modules.text, "nvidia_fs");
      if (line > 0 && text.rfind("nvidia_fs ", 0) == 0) {
        nvfs_loaded = true;
        c.evidence.push_back({"proc/modules", line, text});
      } else {
        c.evidence.push_back({"proc/modules", 0, "no nvidia_fs line"});
      }
    }
    if (ver.ok()) {
      nvfs_loaded = true;
      auto lines = split_lines(*ver.text);
      c.evidence.push_back({"proc/driver/nvidia-fs/version", 1, lines.empty() ? "" : trim(lines[0])});
      f.route.nvfs_version = parse_dotted_version(*ver.text);
    }
    if (nvfs_loaded) {
      c.state = status::ok;
      std::string v = ver.ok() ? trim(*ver.text) : "version unknown";
      if (v.rfind("version:", 0) == 0) v = trim(v.substr(8));
      c.summary = "nvidia-fs loaded (" + v + ")";
    } else if (modules.ok()) {
      c.state = status::fail;
      c.evidence.push_back({"proc/driver/nvidia-fs/version", 0, "absent"});
      const load_failure why = why_not_loaded(root, f, "nvidia_fs");
      c.summary = why.cause.empty() ? "nvidia-fs not loaded" : "nvidia-fs not loaded: " + why.cause;
      for (const auto& e : why.evidence) c.evidence.push_back(e);
      c.fix = !why.fix.empty() ? why.fix
                               : "Install nvidia-fs (apt install nvidia-fs-dkms or nvidia-gds) and modprobe nvidia-fs.";
    } else {
      c.summary = "proc/modules not readable";
    }
    out.checks.push_back(std::move(c));
  }
  f.route.nvfs_loaded = nvfs_loaded;
  if (nvfs_loaded) check_nvfs_health(root, f, out);

  // Symbols: the nvme hook (and which ABI it has), the nvidia_p2p exports and P2PDMA. blk_rq_dma_map_iter_start
  // tells which hook ABI a nvidia-fs built on this kernel looks for.
  auto ks = root.grep("proc/kallsyms", {"nvfs", "nvidia_p2p", "p2pdma", "nvidia_fs", "blk_rq_dma_map_iter_start"});
  bool hidden_addrs = false;
  auto has_sym = [&](const std::string& name) -> std::pair<int, std::string> {
    if (!ks.ok()) return {0, {}};
    auto r = find_line(*ks.text, name);
    if (r.first > 0 && r.second.rfind("0000000000000000", 0) == 0) hidden_addrs = true;
    return r;
  };
  // What nvidia-fs itself says about nvme: its modules list, its kernel log, and libcufile's log.
  std::optional<bool> nvfs_lists_nvme;
  std::pair<int, std::string> nvfs_modules_line;
  if (nvfs_loaded) {
    auto m = root.read("proc/driver/nvidia-fs/modules");
    if (m.ok()) {
      nvfs_modules_line = find_line(*m.text, "nvme:");
      nvfs_lists_nvme = nvfs_modules_line.first > 0;
      if (!*nvfs_lists_nvme) nvfs_modules_line = {0, fmt::format("{} line(s), no nvme", split_lines(*m.text).size())};
    }
  }
  const auto refused = f.dmesg_readable ? last_line_with(f.dmesg, "nvfs registration failed for module sym :nvme")
                                        : std::pair<int, std::string>{0, {}};
  const auto not_registered = f.cufile_log_readable ? last_line_with(f.cufile_log, "NVMe Driver not registered with nvidia-fs")
                                                    : std::pair<int, std::string>{0, {}};
  {
    check c{"kernel.nvme_hook", "NVMe nvfs hook", status::unknown, impact::direct, "", {}, ""};
    auto v1 = has_sym("nvme_v1_register_nvfs_dma_ops");
    auto v2 = has_sym("nvme_v2_register_nvfs_dma_ops");
    // Only the kernel's own function counts: nvidia-fs's configure probes the base kernel, while DOCA-OFED's nvme
    // carries a backport of its own (a module symbol, "[...]" in kallsyms) that nvidia-fs never sees.
    auto iter = has_sym("blk_rq_dma_map_iter_start");
    if (iter.first > 0 && iter.second.find('[') != std::string::npos) iter = {0, {}};
    f.route.nvme_rdma_hook = has_sym("nvme_rdma_v1_register_nvfs_dma_ops").first > 0;
    // nvidia-fs 2.28.2 and later look for the v2 hook when the kernel it was built on has
    // blk_rq_dma_map_iter_start, else for v1; older releases know only v1.
    // proc/driver/nvidia-fs/version has no patch level: 2.28 alone cannot tell 2.28.2 from 2.28.1.
    std::optional<int> wanted;
    if (nvfs_loaded && f.route.nvfs_version && ks.ok()) {
      const auto& v = *f.route.nvfs_version;
      if (iter.first == 0 || v < dotted_version{2, 28, 0}) wanted = 1;
      else if (v >= dotted_version{2, 29, 0} || (f.route.nvfs_version_exact && v >= dotted_version{2, 28, 2})) wanted = 2;
      else if (f.route.nvfs_version_exact) wanted = 1;
    }
    if (!ks.ok()) {
      c.summary = "proc/kallsyms not readable";
    } else if (v1.first == 0 && v2.first == 0) {
      c.state = status::fail;
      c.summary = "no nvme_v1/v2_register_nvfs_dma_ops in kallsyms: the nvme driver is stock, nvidia-fs cannot drive NVMe";
      c.evidence.push_back({"proc/kallsyms", 0, "no nvme_v*_register_nvfs_dma_ops"});
      c.fix = "Boot a kernel whose nvme driver carries the nvfs hook (Ubuntu linux-nvidia / NV-Kernels, DGX OS), or install "
              "MOFED/DOCA mlnx-nvme-dkms with GDS support; or use the PCI P2PDMA route (open driver >= 565, "
              "use_pci_p2pdma).";
    } else {
      const int has = v2.first > 0 ? 2 : 1;
      const auto& hit = has == 2 ? v2 : v1;
      c.evidence.push_back({"proc/kallsyms", hit.first, hit.second});
      if (wanted && *wanted != has && !(v1.first > 0 && v2.first > 0) && nvfs_lists_nvme != true) {
        c.state = status::fail;
        c.summary = fmt::format(
            "hook ABI mismatch: nvme exports nvme_v{}_register_nvfs_dma_ops, but nvidia-fs {} on this kernel ({} "
            "blk_rq_dma_map_iter_start) looks for nvme_v{}_*: nvme never registers and every read falls back to compat "
            "mode",
            has, version_text(*f.route.nvfs_version, f.route.nvfs_version_exact), iter.first > 0 ? "with" : "without", *wanted);
        c.evidence.push_back({"proc/kallsyms", iter.first, iter.first > 0 ? iter.second : "no blk_rq_dma_map_iter_start"});
        c.fix = "Use an nvme driver and nvidia-fs built for the same hook ABI: on DOCA-OFED, 26.04 or later names the hook "
                "after the ABI it compiles (26.01 exports nvme_v2 with the v1 functions); or rebuild nvidia-fs against the "
                "kernel the nvme module was built for.";
      } else {
        c.state = status::ok;
        c.summary = fmt::format("nvme exports its nvfs hook (nvme_v{}_*, NVIDIA-patched nvme driver){}", has,
                                wanted && nvfs_lists_nvme != true ? fmt::format("; the loaded nvidia-fs looks for nvme_v{}_*", *wanted)
                                                                  : std::string());
      }
    }
    f.route.nvme_hook = c.state == status::ok;
    out.checks.push_back(std::move(c));
  }

  if (nvfs_loaded) {
    // "Registered" is what nvidia-fs reports, not the presence of a symbol: nvme appears in its modules list
    // once a cuFile process opened /dev/nvidia-fs* and the registration call succeeded.
    check c{"kernel.nvfs_modules", "nvme registered with nvidia-fs", status::unknown, impact::direct, "", {}, ""};
    if (nvfs_lists_nvme) c.evidence.push_back({"proc/driver/nvidia-fs/modules", nvfs_modules_line.first, nvfs_modules_line.second});
    if (refused.first > 0) c.evidence.push_back({"commands/dmesg.txt", refused.first, refused.second});
    if (not_registered.first > 0) c.evidence.push_back({"commands/cufile-log.txt", not_registered.first, not_registered.second});
    if (nvfs_lists_nvme == true && not_registered.first > 0) {
      c.summary = "contradicting evidence: nvidia-fs lists nvme, but cufile.log says the NVMe driver is not registered "
                  "(the log may be older than the registration)";
      c.fix = "Run a cuFile program (or gdskit doctor with its probe) now, then look at "
              "/proc/driver/nvidia-fs/modules and the new cufile.log lines.";
    } else if (nvfs_lists_nvme == true) {
      c.state = status::ok;
      c.summary = "nvidia-fs lists nvme as registered";
      f.route.nvme_registered = true;
    } else if (refused.first > 0 || not_registered.first > 0) {
      c.state = status::fail;
      c.summary = refused.first > 0 ? "the nvme driver refused nvidia-fs's registration (kernel log)"
                                    : "libcufile found the NVMe driver not registered with nvidia-fs: reads fall back to compat mode";
      c.fix = "See kernel.nvme_hook: the nvme driver must export the hook ABI the loaded nvidia-fs looks for.";
    } else if (!nvfs_lists_nvme) {
      c.summary = "proc/driver/nvidia-fs/modules not readable: registration of nvme not known";
      c.fix = "Read /proc/driver/nvidia-fs/modules (root may be needed) after a cuFile program ran.";
    } else {
      c.summary = "nvidia-fs does not list nvme (yet): the symbol is there, the registration is not shown; nvme "
                  "registers when a cuFile process opens /dev/nvidia-fs*";
      c.fix = "Run a cuFile program once (or gdskit doctor with its probe), then capture again; nvme must "
              "appear in /proc/driver/nvidia-fs/modules.";
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"kernel.nvidia_p2p", "nvidia_p2p exports", status::unknown, impact::direct, "", {}, ""};
    auto p = has_sym("nvidia_p2p_get_pages_persistent");
    if (p.first == 0) p = has_sym("nvidia_p2p_get_pages");
    if (!ks.ok()) {
      c.summary = "proc/kallsyms not readable";
    } else if (p.first > 0) {
      c.state = status::ok;
      c.summary = "the nvidia module provides nvidia_p2p_get_pages*";
      c.evidence.push_back({"proc/kallsyms", p.first, p.second});
    } else {
      c.state = status::fail;
      c.summary = "no nvidia_p2p_get_pages* in kallsyms: GPU memory cannot be pinned for third-party DMA";
      c.evidence.push_back({"proc/kallsyms", 0, "no nvidia_p2p_get_pages"});
      c.fix = "Load the NVIDIA kernel module (nvidia.ko provides the nvidia_p2p_* API).";
    }
    if (hidden_addrs) c.summary += " (addresses hidden: not root)";
    out.checks.push_back(std::move(c));
  }
  {
    check c{"kernel.p2pdma", "PCI P2PDMA route (no nvidia-fs)", status::warn, impact::none, "", {}, ""};
    auto k = has_sym("p2pdma_pgmap_ops");
    if (k.first > 0) c.evidence.push_back({"proc/kallsyms", k.first, k.second});
    // The same rule and reasons as the planner's (engine/route_facts).
    engine::p2pdma_facts pf;
    pf.kernel_p2pdma = k.first > 0;
    pf.open_module = f.open_module;
    pf.driver_major = f.driver_major;
    pf.static_bar1 = engine::registry_sets_static_bar1(f.registry_dwords);
    pf.use_pci_p2pdma = f.use_pci_p2pdma.value_or(false);
    const std::vector<std::string> missing = engine::p2pdma_missing(pf);
    if (missing.empty()) {
      c.state = status::ok;
      f.route.p2pdma_ready = true;
      c.summary = "PCI P2PDMA route configured (kernel, open driver, static BAR1, use_pci_p2pdma)";
    } else {
      c.summary = "P2PDMA route not ready: " + fmt::format("{}", fmt::join(missing, "; "));
      c.fix = "Only needed without nvidia-fs: kernel with CONFIG_PCI_P2PDMA, open driver >= 565, "
              "options nvidia NVreg_RegistryDwords=\"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\", "
              "\"use_pci_p2pdma\": true in cufile.json.";
    }
    out.checks.push_back(std::move(c));
  }
  // With a ready P2PDMA route (libcufile prefers it for NVMe), nvidia-fs and its hook are not on the route.
  if (f.route.p2pdma_ready) {
    for (auto& c : out.checks) {
      const bool nvfs_only = c.id == "kernel.nvidia_fs" || c.id == "kernel.nvme_hook" || c.id == "kernel.nvfs_modules" ||
                             c.id == "kernel.nvfs_stats" || c.id == "kernel.nvfs_release";
      if (nvfs_only && (c.state == status::fail || c.state == status::unknown)) {
        c.state = status::warn;
        c.blocks = impact::none;
        c.summary += " (not on the route: the PCI P2PDMA route is configured)";
      }
    }
  }
  return out;
}

}  // namespace gdskit::doctor
