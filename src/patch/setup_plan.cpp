// The steps after the source patch, as a plan a person reads before anything runs.
#include <sstream>

#include <fmt/format.h>

#include "posix/in_root.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/error.hpp"
#include "patch/patch.hpp"

namespace gdskit::patch {
namespace fs = std::filesystem;
namespace {

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

system_facts read_system_facts(const fs::path& root_dir) {
  // A root other than / is a captured one: every read resolves inside it.
  const posix::root_files root(root_dir);
  auto read_small = [&](std::string_view rel) { return root.read(rel, 1 << 20).text.value_or(""); };
  system_facts f;
  f.kernel_release = first_line(read_small("proc/sys/kernel/osrelease"));
  f.loaded_driver_version = first_line(read_small("sys/module/nvidia/version"));
  const std::string drv = read_small("proc/driver/nvidia/version");
  f.open_module = drv.find("Open Kernel Module") != std::string::npos;
  f.nvidia_fs_loaded = root.exists("sys/module/nvidia_fs");
  // kallsyms is large; scanning it line by line keeps memory flat, and the scan is bounded like the doctor's.
  auto scan = root.scan_lines("proc/kallsyms", 256u << 20, 4096, [&](std::string_view line) {
    if (!f.nvfs_symbol.empty()) return;
    for (std::string_view sym : {"nvme_v2_register_nvfs_dma_ops", "nvme_v1_register_nvfs_dma_ops"}) {
      const auto at = line.rfind(sym);
      if (at != std::string_view::npos && at > 0 && line[at - 1] == ' ' &&
          (at + sym.size() == line.size() || line[at + sym.size()] == '\t' || line[at + sym.size()] == ' ')) {
        f.nvfs_symbol = std::string(sym);
      }
    }
  });
  (void)scan;  // unreadable or not a regular file: no hook known, which the plan handles
  std::istringstream os(read_small("etc/os-release"));
  for (std::string line; std::getline(os, line);) {
    if (line.rfind("ID=", 0) == 0) {
      f.distro_id = line.substr(3);
      if (f.distro_id.size() >= 2 && f.distro_id.front() == '"') f.distro_id = f.distro_id.substr(1, f.distro_id.size() - 2);
    }
  }
  return f;
}

std::vector<plan_step> make_setup_plan(const system_facts& sys, const plan_options& opts) {
  std::vector<plan_step> steps;
  // A newline in a path would end the comment a rollback line sits in and make it a command.
  if (has_control_chars(opts.src.string())) {
    throw error(errno_code(EINVAL), "setup plan", opts.src.string(), -1, 0,
                "the driver source path holds control characters");
  }
  const std::string src = opts.src.empty() ? std::string("\"$GDSKIT_DRIVER_SRC\"") : shell_quote(opts.src.string());
  const std::string krel = "\"$(uname -r)\"";
  const std::string atomics = opts.atomics == atomics_mode::off ? "off" : "default";
  const std::string backup_dir = "/var/backups/gdskit/nvidia-$(uname -r)";
  const bool debian_like = sys.distro_id == "ubuntu" || sys.distro_id == "debian" || sys.distro_id.empty();

  if (sys.nvfs_symbol.empty()) {
    steps.push_back({"Install a kernel whose NVMe driver carries the nvfs hook",
                     "nvidia-fs can only route NVMe reads to the GPU when nvme.ko exports "
                     "nvme_v1_register_nvfs_dma_ops or nvme_v2_register_nvfs_dma_ops; stock kernels do not. On "
                     "Ubuntu the linux-nvidia flavour does. Pick the package from the list, install it, then reboot "
                     "into it and run this plan again.",
                     debian_like ? "apt-cache search --names-only '^linux-image-.*nvidia' | sort" : "",
                     "", true});
  }
  steps.push_back({"Verify the nvfs hook of the running kernel",
                   "the name must appear in /proc/kallsyms (addresses read as 0 without root; the name is enough)",
                   "grep -wE 'nvme_v[12]_register_nvfs_dma_ops' /proc/kallsyms", "", false});
  steps.push_back({"Check the driver source matches the loaded driver",
                   fmt::format("the module you build must be the version libcuda expects (loaded now: {})",
                               sys.loaded_driver_version.empty() ? "none" : sys.loaded_driver_version),
                   fmt::format("grep '^NVIDIA_VERSION' {}/version.mk && cat /sys/module/nvidia/version", src), "",
                   false});
  steps.push_back({"Patch the driver source",
                   opts.use_registry_dwords
                       ? "only the HAL half: the BIF overrides come from NVreg_RegistryDwords (a later step)"
                       : "BIF overrides and HAL renames; check first, apply refuses unknown layouts",
                   fmt::format("gdskit patch check --src {0} && gdskit patch apply --src {0} --atomics {1}{2}", src,
                               atomics, opts.use_registry_dwords ? " --only hal" : ""),
                   fmt::format("gdskit patch revert --src {}", src), false});
  steps.push_back({"Build the modules for the running kernel", "the build must use this kernel's headers",
                   fmt::format("make -C {} modules -j\"$(nproc)\" SYSSRC=/lib/modules/{}/build", src, krel),
                   fmt::format("make -C {} clean", src), false});
  steps.push_back({"Back up the installed nvidia modules",
                   "rollback copies them back; the folder is the one modinfo reports for the nvidia module",
                   fmt::format("d=\"$(dirname \"$(modinfo -n nvidia)\")\" && sudo mkdir -p {0} && "
                               "echo \"$d\" | sudo tee {0}/FROM >/dev/null && sudo cp -a \"$d\"/nvidia*.ko* {0}/",
                               backup_dir),
                   "", false});
  steps.push_back({"Install the patched modules",
                   "into the same folder, so DKMS or distribution modules elsewhere do not shadow them; compressed "
                   "originals are removed (they are in the backup) so only one copy of each module remains",
                   fmt::format("d=\"$(cat {0}/FROM)\" && sudo rm -f \"$d\"/nvidia*.ko.zst \"$d\"/nvidia*.ko.xz "
                               "\"$d\"/nvidia*.ko.gz && sudo install -m 0644 {1}/kernel-open/nvidia*.ko \"$d\"/",
                               backup_dir, src),
                   fmt::format("d=\"$(cat {0}/FROM)\" && sudo rm -f \"$d\"/nvidia*.ko && "
                               "sudo cp -a {0}/nvidia*.ko* \"$d\"/",
                               backup_dir),
                   false});
  if (opts.use_registry_dwords) {
    const auto v = parse_version(sys.loaded_driver_version);
    if (v && version_supported(*v)) {
      const auto rd = make_registry_dwords(*v, opts.atomics);
      steps.push_back({"Set the BIF overrides as module options", "same effect as the three kernel_bif.c edits",
                       fmt::format("printf '%s\\n' {} | sudo tee /etc/modprobe.d/gdskit-p2p.conf >/dev/null",
                                   shell_quote(fmt::format("options nvidia NVreg_RegistryDwords=\"{}\"", rd.value))),
                       "sudo rm -f /etc/modprobe.d/gdskit-p2p.conf", false});
    } else {
      // The value depends on the driver series; a guess could select another P2P type.
      steps.push_back({"Set the BIF overrides as module options",
                       v ? fmt::format("the loaded driver {} is not a series gdskit knows (550 to 595): no value is "
                                       "written for it", v->text)
                         : std::string("the loaded driver version is unknown: the value depends on it"),
                       "gdskit patch registry-dwords --driver-version <version of the built module> | "
                       "sudo tee /etc/modprobe.d/gdskit-p2p.conf",
                       "sudo rm -f /etc/modprobe.d/gdskit-p2p.conf", true});
    }
  }
  steps.push_back({"Rebuild the module index and the initramfs",
                   "the initramfs may carry its own copy of the nvidia modules and modprobe options",
                   debian_like ? fmt::format("sudo depmod -a {0} && sudo update-initramfs -u -k {0}", krel)
                               : fmt::format("sudo depmod -a {0} && sudo dracut -f --kver {0}", krel),
                   debian_like ? fmt::format("sudo depmod -a {0} && sudo update-initramfs -u -k {0}", krel)
                               : fmt::format("sudo depmod -a {0} && sudo dracut -f --kver {0}", krel),
                   false});
  steps.push_back({"Reboot", "loads the new modules (and the new kernel, if one was installed)", "", "", true});
  steps.push_back({"Load nvidia-fs and judge", "doctor pins GPU memory through the real GDS path; only that proves it",
                   "sudo modprobe nvidia-fs && gdskit doctor", "", false});
  return steps;
}

std::string render_plan(const std::vector<plan_step>& steps, const system_facts& sys) {
  std::string out = "#!/bin/sh\n";
  out += fmt::format("# gdskit setup plan. Kernel {}, loaded nvidia driver {} ({}), nvfs hook: {}.\n",
                     sys.kernel_release.empty() ? "unknown" : printable(sys.kernel_release),
                     sys.loaded_driver_version.empty() ? "none" : printable(sys.loaded_driver_version),
                     sys.open_module ? "open kernel module" : "open module not detected",
                     sys.nvfs_symbol.empty() ? "MISSING" : sys.nvfs_symbol);
  out += "# Review every step. Nothing has run. `gdskit setup plan --execute` asks before each step and stops\n"
         "# at the first failure. Steps marked MANUAL are for you to do.\n";
  out += "#\n";
  std::string note(honesty_note());
  for (std::size_t pos = 0; pos < note.size();) {
    auto nl = note.find('\n', pos);
    if (nl == std::string::npos) nl = note.size();
    out += fmt::format("# {}\n", note.substr(pos, nl - pos));
    pos = nl + 1;
  }
  out += "set -eu\n";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    out += fmt::format("\n# --- Step {}: {}{}\n# {}\n", i + 1, printable(s.title), s.manual ? " (MANUAL)" : "",
                       printable(s.why));
    if (!s.command.empty()) out += s.manual ? fmt::format("# suggested: {}\n", printable(s.command)) : s.command + "\n";
  }
  out += "\n# === Rollback plan (run from the last step done backwards) ===\n";
  for (std::size_t i = steps.size(); i-- > 0;) {
    if (steps[i].rollback.empty()) continue;
    // The rollback is shell text built from quoted paths: printed as it is where escaping would only double
    // its backslashes (the quoting of a path with a quote), so that the line runs once uncommented; any other
    // byte the escaping changes (controls, bytes that are not UTF-8) keeps the escaped form.
    const std::string& undo = steps[i].rollback;
    std::string shown = printable(undo);
    std::string halved;
    for (std::size_t k = 0; k < shown.size(); ++k) {
      halved += shown[k];
      if (shown[k] == '\\' && k + 1 < shown.size() && shown[k + 1] == '\\') ++k;
    }
    if (halved == undo) shown = undo;
    out += fmt::format("# undo step {} ({}):\n#   {}\n", i + 1, printable(steps[i].title), shown);
  }
  out += "# then reboot, and run `gdskit doctor` to confirm the stock driver is back.\n";
  return out;
}

plan_run_result execute_plan(const std::vector<plan_step>& steps, const std::function<bool(const plan_step&)>& ask,
                             const std::function<int(const std::string&)>& run) {
  plan_run_result r;
  for (const auto& s : steps) {
    if (!ask(s)) {
      r.stopped_by_user = true;
      return r;
    }
    if (!s.manual && !s.command.empty()) {
      const int status = run(s.command);
      if (status != 0) {
        r.failed = true;
        r.failed_step = s.title;
        r.failed_status = status;
        return r;
      }
    }
    ++r.steps_done;
  }
  return r;
}

}  // namespace gdskit::patch
