// GPU and driver layer: which NVIDIA GPUs, which kernel module, GPU class, GSP, BAR1 and PCIe link.
#include <fmt/format.h>

#include <algorithm>

#include "doctor/checks.hpp"

namespace gdskit::doctor {
namespace {

constexpr std::uint64_t mib = 1024 * 1024;

// Data-center and workstation parts have the RM object that third-party P2P needs; GeForce does not.
bool data_center_class(const std::string& model) {
  static const char* const names[] = {"Tesla", "H100", "H200", "H800", "H20", "GH200", "A100", "A800", "A30",
                                      "A40",   "A10",  "A16",  "A2",   "L4",  "L40",   "B100", "B200", "B300",
                                      "GB200", "RTX A", "RTX PRO", "Quadro", "RTX 6000", "RTX 5000", "RTX 4000"};
  return std::any_of(std::begin(names), std::end(names),
                     [&](const char* n) { return model.find(n) != std::string::npos; });
}

}  // namespace

layer check_gpu(system_root& root, facts& f) {
  layer out{"gpu", "GPU and driver", {}};

  // Driver flavour and version.
  {
    check c{"gpu.driver", "NVIDIA kernel driver", status::unknown, impact::cufile, "", {}, ""};
    auto v = root.read("proc/driver/nvidia/version");
    if (!v.ok() && v.error != std::errc::no_such_file_or_directory) {
      c.summary = "/proc/driver/nvidia/version not readable: " + v.reason();
      c.evidence.push_back({"proc/driver/nvidia/version", 0, v.reason()});
    } else if (!v.ok()) {
      c.state = status::fail;
      c.evidence.push_back({"proc/driver/nvidia/version", 0, v.reason()});
      const load_failure why = why_not_loaded(root, f, "nvidia");
      c.summary = why.cause.empty() ? "NVIDIA kernel driver not loaded (no /proc/driver/nvidia/version)"
                                    : "NVIDIA kernel driver not loaded: " + why.cause;
      for (const auto& e : why.evidence) c.evidence.push_back(e);
      c.fix = !why.fix.empty() ? why.fix
                               : "Install and load the NVIDIA open kernel module (nvidia-open / nvidia-driver-<ver>-open), "
                                 "then modprobe nvidia.";
    } else {
      auto lines = split_lines(*v.text);
      std::string first = lines.empty() ? "" : trim(lines[0]);
      c.evidence.push_back({"proc/driver/nvidia/version", 1, first});
      const auto ver = first.rfind("NVRM version:", 0) == 0 ? find_version_token(first) : std::nullopt;
      if (!ver) {
        c.state = status::unknown;
        c.summary = "unrecognised /proc/driver/nvidia/version";
        c.fix = "Check that the NVIDIA driver loaded correctly (dmesg | grep NVRM).";
      } else {
        f.driver_major = ver->major;
        f.open_module = first.find("Open Kernel Module") != std::string::npos;
        c.state = status::ok;
        c.summary = fmt::format("driver {} ({} kernel module)", ver->text, f.open_module ? "open" : "proprietary");
      }
    }
    out.checks.push_back(std::move(c));

    check o{"gpu.open_module", "Open kernel module", status::unknown, impact::direct, "", {}, ""};
    if (out.checks.back().state == status::ok) {
      o.evidence = out.checks.back().evidence;
      // nvidia-fs before 2.17.5 still found nvidia_p2p_* through symbol_get and works with the proprietary module.
      const auto nvfs = root.read("proc/driver/nvidia-fs/version");
      const auto nvfs_version = nvfs.ok() ? parse_dotted_version(*nvfs.text) : std::nullopt;
      if (f.open_module) {
        o.state = status::ok;
        o.summary = "NVIDIA UNIX Open Kernel Module (needed by nvidia-fs >= 2.17.5 and by PCI P2PDMA)";
      } else if (nvfs_version && *nvfs_version < dotted_version{2, 17, 5}) {
        o.state = status::warn;
        o.summary = fmt::format("proprietary kernel module: works with the loaded nvidia-fs {}.{} (older than 2.17.5), "
                                "but not with newer nvidia-fs or the PCI P2PDMA route",
                                nvfs_version->major, nvfs_version->minor);
        o.evidence.push_back({"proc/driver/nvidia-fs/version", 1, trim(*nvfs.text)});
        o.fix = "Plan the switch to the open kernel module before upgrading nvidia-fs.";
      } else {
        o.state = status::fail;
        o.summary = "proprietary kernel module: nvidia-fs >= 2.17.5 and PCI P2PDMA need the open module";
        o.fix = "Switch to the open kernel module (apt install nvidia-driver-<ver>-open, or the .run installer with -m=kernel-open).";
      }
    } else {
      o.summary = "driver flavour unknown";
    }
    out.checks.push_back(std::move(o));
  }

  // GPUs as the driver lists them.
  std::error_code ec;
  auto bdfs = root.list("proc/driver/nvidia/gpus", ec);
  bdfs.erase(std::remove_if(bdfs.begin(), bdfs.end(), [](const std::string& b) { return !is_bdf(b); }),
             bdfs.end());
  auto smi = root.command("nvidia-smi-q");
  {
    check c{"gpu.devices", "NVIDIA GPUs", status::ok, impact::cufile, "", {}, ""};
    if (bdfs.empty()) {
      c.state = status::fail;
      c.summary = "no NVIDIA GPU known to the driver";
      c.evidence.push_back({"proc/driver/nvidia/gpus", 0, ec ? ec.message() : "empty"});
      c.fix = "Check that the GPU is visible (lspci -d 10de:) and that the nvidia module bound to it (dmesg | grep NVRM).";
    }
    std::vector<std::string> names;
    for (const auto& bdf : bdfs) {
      gpu_fact g;
      g.bdf = bdf;
      const std::string info_path = "proc/driver/nvidia/gpus/" + bdf + "/information";
      auto info = root.read(info_path);
      if (info.ok()) {
        if (auto model = find_field(*info.text, "Model")) {
          g.model = model->first;
          c.evidence.push_back({info_path, model->second, "Model: " + model->first});
        }
      }
      const std::string dev = "sys/bus/pci/devices/" + bdf;
      auto vendor = root.read(dev + "/vendor");
      auto device = root.read(dev + "/device");
      std::string ids = vendor.ok() && device.ok()
                            ? fmt::format("{}:{}", trim(*vendor.text), trim(*device.text))
                            : std::string("ids unknown");
      if (vendor.ok()) c.evidence.push_back({dev + "/device", 1, ids});
      if (g.model.empty()) {
        g.model = "unknown model";
        c.state = status::unknown;
      }
      g.geforce = g.model.find("GeForce") != std::string::npos ||
                  (smi.ok() && find_field(*smi.text, "Product Brand").value_or(std::make_pair(std::string(), 0)).first ==
                                   "GeForce");
      auto rp = root.real_path(dev);
      if (!rp.ok()) {
        // Older captures keep the sysfs links only as an `ls -l` listing.
        auto ls = root.command("ls-sys-bus-pci-devices");
        if (ls.ok()) {
          for (const auto& l : split_lines(*ls.text)) {
            auto arrow = l.find(" -> ");
            if (arrow != std::string::npos && l.find(bdf + " -> ") != std::string::npos) {
              std::string t = trim(l.substr(arrow + 4));
              auto pos = t.find("devices/");
              if (pos != std::string::npos) g.sys_path = "/sys/" + t.substr(pos);
            }
          }
        }
      } else {
        g.sys_path = *rp.text;
      }
      names.push_back(fmt::format("{} {} [{}]", bdf, g.model, ids));
      f.gpus.push_back(std::move(g));
    }
    if (!bdfs.empty()) c.summary = fmt::format("{} GPU(s): {}", bdfs.size(), fmt::join(names, "; "));
    out.checks.push_back(std::move(c));
  }

  // GPU class: GeForce parts refuse the third-party P2P pin with a stock driver.
  for (const auto& g : f.gpus) {
    check c{"gpu.class", "GPU class " + g.bdf, status::ok, impact::direct, "", {}, ""};
    c.evidence.push_back({"proc/driver/nvidia/gpus/" + g.bdf + "/information", 0, g.model});
    if (g.geforce) {
      c.state = status::warn;
      c.summary = g.model + " is a GeForce part: the stock driver refuses the P2P pin (nvidia_p2p_get_pages -22)";
      c.fix = "Use a data-center/workstation GPU, or build the open kernel module with the gdskit P2P patch (gdskit patch).";
    } else if (data_center_class(g.model)) {
      c.summary = g.model + " is a data-center/workstation part";
    } else {
      c.state = status::warn;
      c.summary = g.model + ": class not recognised; P2P support is not known";
    }
    out.checks.push_back(std::move(c));
  }

  // GSP firmware.
  {
    check c{"gpu.gsp", "GSP firmware", status::ok, impact::none, "", {}, ""};
    auto params = root.read("proc/driver/nvidia/params");
    std::string value = "unknown";
    if (params.ok()) {
      if (auto v = find_field(*params.text, "EnableGpuFirmware")) {
        value = v->first;
        c.evidence.push_back({"proc/driver/nvidia/params", v->second, "EnableGpuFirmware: " + v->first});
      }
      if (auto r = find_field(*params.text, "RegistryDwords")) {
        f.registry_dwords = r->first;
        c.evidence.push_back({"proc/driver/nvidia/params", r->second, "RegistryDwords: " + r->first});
      }
    }
    if (f.open_module) {
      c.summary = fmt::format("GSP in use: the open module always runs GSP firmware (EnableGpuFirmware={})", value);
    } else if (value == "unknown") {
      c.state = status::unknown;
      c.summary = "EnableGpuFirmware not readable";
    } else {
      auto v = parse_u64(value);
      c.summary = fmt::format("EnableGpuFirmware={} (GSP {})", value, v && (*v & 1) ? "enabled" : "disabled");
    }
    out.checks.push_back(std::move(c));
  }

  // BAR1 against VRAM, per GPU.
  for (const auto& g : f.gpus) {
    check c{"gpu.bar1", "BAR1 " + g.bdf, status::unknown, impact::direct, "", {}, ""};
    const std::string res = "sys/bus/pci/devices/" + g.bdf + "/resource";
    auto r = root.read(res);
    std::optional<std::uint64_t> bar1;
    if (r.ok()) {
      // BAR1 is the first assigned region after BAR0: resource index 1 when BAR0 is 32-bit, index 2 when
      // BAR0 is 64-bit (Hopper) and takes two slots.
      auto lines = split_lines(*r.text);
      bool parsed = lines.size() >= 6;
      for (std::size_t i = 1; i < std::min<std::size_t>(lines.size(), 6) && !bar1; ++i) {
        std::vector<std::string> parts;
        std::string tok;
        for (char ch : lines[i] + " ") {
          if (ch == ' ' || ch == '\t') {
            if (!tok.empty()) parts.push_back(tok);
            tok.clear();
          } else {
            tok += ch;
          }
        }
        auto start = parts.size() >= 2 ? parse_u64(parts[0]) : std::nullopt;
        auto end = parts.size() >= 2 ? parse_u64(parts[1]) : std::nullopt;
        if (!start || !end) {
          parsed = false;
          break;
        }
        if (*end == 0 || *end < *start) continue;
        bar1 = *end - *start + 1;
        c.evidence.push_back({res, static_cast<int>(i + 1), trim(lines[i])});
      }
      if (!bar1 && parsed) bar1 = 0;
    }
    std::optional<std::uint64_t> vram;
    if (smi.ok()) {
      if (auto t = find_field(*smi.text, "Total", "FB Memory Usage")) {
        if (auto n = parse_u64(t->first.substr(0, t->first.find(' ')))) vram = *n * mib;
        c.evidence.push_back({"commands/nvidia-smi-q.txt", t->second, "FB Memory Usage Total: " + t->first});
      }
      if (!bar1) {
        if (auto t = find_field(*smi.text, "Total", "BAR1 Memory Usage")) {
          if (auto n = parse_u64(t->first.substr(0, t->first.find(' ')))) bar1 = *n * mib;
          c.evidence.push_back({"commands/nvidia-smi-q.txt", t->second, "BAR1 Memory Usage Total: " + t->first});
        }
      }
    }
    if (!bar1) {
      c.summary = "BAR1 size not readable";
    } else if (*bar1 == 0) {
      c.state = status::fail;
      c.summary = "BAR1 not assigned: nothing can be pinned for P2P";
      c.fix = "Enable Above 4G Decoding and Resizable BAR in the firmware setup; avoid pci=realloc=off.";
    } else if (vram && *bar1 < *vram) {
      c.state = status::warn;
      c.summary = fmt::format("BAR1 {} MiB < VRAM {} MiB: Resizable BAR is off; at most ~{} MiB of GPU memory can be "
                              "registered with cuFile at a time",
                              *bar1 / mib, *vram / mib, *bar1 / mib);
      c.fix = "Enable Above 4G Decoding and Resizable BAR in the firmware setup (and NVreg_EnableResizableBar=1 where supported), "
              "or keep registered buffers below the BAR1 size.";
    } else {
      c.state = status::ok;
      c.summary = vram ? fmt::format("BAR1 {} MiB >= VRAM {} MiB", *bar1 / mib, *vram / mib)
                       : fmt::format("BAR1 {} MiB (VRAM unknown)", *bar1 / mib);
    }
    out.checks.push_back(std::move(c));
  }

  // PCIe link now and at most.
  for (const auto& g : f.gpus) {
    check c{"gpu.pcie_link", "PCIe link " + g.bdf, status::unknown, impact::none, "", {}, ""};
    const std::string dev = "sys/bus/pci/devices/" + g.bdf + "/";
    auto cs = root.read(dev + "current_link_speed");
    auto ms = root.read(dev + "max_link_speed");
    auto cw = root.read(dev + "current_link_width");
    auto mw = root.read(dev + "max_link_width");
    if (cs.ok() && ms.ok() && cw.ok() && mw.ok()) {
      std::string s_now = trim(*cs.text), s_max = trim(*ms.text), w_now = trim(*cw.text), w_max = trim(*mw.text);
      c.evidence.push_back({dev + "current_link_speed", 1, s_now});
      c.evidence.push_back({dev + "current_link_width", 1, w_now});
      c.summary = fmt::format("x{} at {} (max x{} at {})", w_now, s_now, w_max, s_max);
      auto wn = parse_u64(w_now), wm = parse_u64(w_max);
      if (wn && wm && *wn < *wm) {
        c.state = status::warn;
        c.summary += ": link runs narrower than it can";
        c.fix = "Reseat the card or move it to a full-width slot; check riser cables.";
      } else {
        c.state = status::ok;
        if (s_now != s_max) c.summary += " (an idle GPU lowers its link speed; check under load)";
      }
    } else {
      c.summary = "link speed/width not readable (virtual PCI or no sysfs)";
    }
    out.checks.push_back(std::move(c));
  }
  return out;
}

}  // namespace gdskit::doctor
