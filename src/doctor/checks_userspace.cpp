// User-space layer: libcufile, the effective cufile.json, the udev database, container/WSL, memlock.
#include <fmt/format.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_text.hpp"

#include "doctor/checks.hpp"
#include "doctor/json_input.hpp"

namespace gdskit::doctor {
namespace {

using json = nlohmann::json;

const json* at_path(const json& j, std::initializer_list<const char*> keys) {
  const json* cur = &j;
  for (const char* k : keys) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::optional<bool> get_bool(const json& j, std::initializer_list<const char*> keys) {
  const json* v = at_path(j, keys);
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<std::uint64_t> get_u64(const json& j, std::initializer_list<const char*> keys) {
  const json* v = at_path(j, keys);
  if (v == nullptr || !v->is_number_unsigned()) return std::nullopt;
  return v->get<std::uint64_t>();
}

// 1-based line where a key first appears (for evidence), 0 when not found.
int line_of(const std::string& text, const std::string& key) {
  auto lines = split_lines(text);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find("\"" + key + "\"") != std::string::npos) return static_cast<int>(i + 1);
  }
  return 0;
}

std::vector<std::string> find_libcufile(system_root& root) {
  std::vector<std::string> dirs = {"usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu",
                                   "usr/local/cuda/lib64", "usr/local/cuda/targets/x86_64-linux/lib",
                                   "usr/local/nvidia/lib64", "usr/local/nvidia/lib"};
  std::error_code ec;
  for (const auto& d : root.list("usr/local", ec)) {
    if (d.rfind("cuda-", 0) == 0) {
      dirs.push_back("usr/local/" + d + "/lib64");
      dirs.push_back("usr/local/" + d + "/targets/x86_64-linux/lib");
    }
  }
  std::vector<std::string> found;
  for (const auto& d : dirs) {
    for (const auto& n : root.list(d, ec)) {
      if (n.rfind("libcufile.so", 0) == 0) found.push_back("/" + d + "/" + n);
    }
  }
  return found;
}

}  // namespace

void read_cufile_config(system_root& root, facts& f, layer& userspace) {
  std::string rel = "etc/cufile.json";
  if (root.live()) {
    const char* env = std::getenv("CUFILE_ENV_PATH_JSON");
    if (env != nullptr && *env == '/') rel = env + 1;
  }
  auto r = root.read(rel);
  if (!r.ok()) {
    check c{"userspace.cufile_json", "cufile.json", status::ok, impact::none, "", {}, ""};
    c.summary = "no " + ("/" + rel) + ": cuFile uses its built-in defaults (allow_compat_mode true)";
    c.evidence.push_back({rel, 0, r.reason()});
    userspace.checks.push_back(std::move(c));
    return;
  }
  check c = judge_cufile_json(*r.text, rel, f);
  if (root.live()) {
    const char* force = std::getenv("CUFILE_FORCE_COMPAT_MODE");
    if (force != nullptr && std::string(force) == "true") {
      c.state = status::fail;
      c.blocks = impact::direct;
      c.summary += "; CUFILE_FORCE_COMPAT_MODE=true in the environment";
      c.fix = "Unset CUFILE_FORCE_COMPAT_MODE.";
    }
  }
  userspace.checks.push_back(std::move(c));
}

check judge_cufile_json(const std::string& text, const std::string& rel, facts& f) {
  check c{"userspace.cufile_json", "cufile.json", status::ok, impact::none, "", {}, ""};
  std::string why;
  json j = parse_json_bounded(text, /*comments=*/true, why);
  if (j.is_discarded() || !j.is_object()) {
    if (why.empty()) why = "not a JSON object";
    c.state = status::warn;
    c.summary = "/" + rel + " is not usable JSON (" + why + "): cuFile may refuse to start or ignore it";
    c.evidence.push_back({rel, 0, why});
    c.fix = "Restore a valid cufile.json (the packaged copy is /usr/local/cuda/gds/cufile.json).";
    return c;
  }
  f.cufile_json_read = true;
  f.use_pci_p2pdma = get_bool(j, {"properties", "use_pci_p2pdma"});
  std::vector<std::string> notes;
  std::vector<std::string> warns;
  auto allow = get_bool(j, {"properties", "allow_compat_mode"});
  notes.push_back(fmt::format("allow_compat_mode {}", allow.value_or(true)));
  if (int l = line_of(text, "allow_compat_mode")) c.evidence.push_back({rel, l, fmt::format("allow_compat_mode: {}", allow.value_or(true))});
  notes.push_back(fmt::format("use_pci_p2pdma {}", f.use_pci_p2pdma.value_or(false)));
  if (int l = line_of(text, "use_pci_p2pdma")) c.evidence.push_back({rel, l, fmt::format("use_pci_p2pdma: {}", f.use_pci_p2pdma.value_or(false))});
  if (get_bool(j, {"properties", "force_compat_mode"}).value_or(false)) {
    c.state = status::fail;
    c.blocks = impact::direct;
    warns.push_back("force_compat_mode is true: every IO goes through host memory");
    c.evidence.push_back({rel, line_of(text, "force_compat_mode"), "force_compat_mode: true"});
  }
  if (auto pinned = get_u64(j, {"properties", "max_device_pinned_mem_size_kb"})) {
    notes.push_back(fmt::format("max_device_pinned_mem_size_kb {}", *pinned));
    if (*pinned < 1024 * 1024) warns.push_back("max_device_pinned_mem_size_kb below 1 GiB limits registered GPU buffers");
  }
  auto cache = get_u64(j, {"properties", "max_device_cache_size_kb"});
  auto per_buf = get_u64(j, {"properties", "per_buffer_cache_size_kb"});
  auto batch = get_u64(j, {"properties", "io_batchsize"});
  if (cache && per_buf && *per_buf > 0 && batch && *cache / *per_buf < *batch) {
    warns.push_back(fmt::format("max_device_cache_size_kb/per_buffer_cache_size_kb = {} < io_batchsize {}: batch IO "
                                "runs out of bounce buffers", *cache / *per_buf, *batch));
  }
  if (get_bool(j, {"fs", "generic", "posix_unaligned_writes"}).value_or(false))
    warns.push_back("fs.generic.posix_unaligned_writes true: unaligned writes go through POSIX");
  if (const json* deny = at_path(j, {"denylist"}); deny != nullptr && deny->is_object()) {
    // cuFile knows five deny lists; a document with thousands of keys is named, not searched line by line.
    std::size_t shown = 0, more = 0;
    for (auto it = deny->begin(); it != deny->end(); ++it) {
      if (it.value().is_array() && !it.value().empty() && ++shown > 8) {
        ++more;
      } else if (it.value().is_array() && !it.value().empty()) {
        // A deny list is a few names; a hostile one is cut so the report stays readable.
        std::string value = json_text(it.value(), -1);
        if (value.size() > 200) value = value.substr(0, 200) + "...";
        std::string key = it.key().size() > 64 ? it.key().substr(0, 64) + "..." : it.key();
        warns.push_back(fmt::format("denylist.{} = {}", key, value));
        c.evidence.push_back({rel, line_of(text, it.key()), fmt::format("denylist.{}: {}", key, value)});
      }
    }
    if (more > 0) warns.push_back(fmt::format("{} more non-empty deny lists", more));
  }
  if (!warns.empty() && c.state == status::ok) c.state = status::warn;
  c.summary = fmt::format("/{}: {}", rel, fmt::join(notes, ", "));
  if (!warns.empty()) c.summary += "; " + fmt::format("{}", fmt::join(warns, "; "));
  if (c.state != status::ok)
    c.fix = "Edit /" + rel + ": remove force_compat_mode, empty the deny lists unless intended, keep "
            "max_device_cache_size_kb/per_buffer_cache_size_kb >= io_batchsize.";
  return c;
}

void check_userspace(system_root& root, facts& f, layer& out) {
  {
    check c{"userspace.libcufile", "libcufile", status::unknown, impact::cufile, "", {}, ""};
    std::vector<std::string> found;
    bool known = false;
    if (!root.live()) {
      auto cmd = root.command("libcufile");
      if (cmd.ok()) {
        known = true;
        for (const auto& l : split_lines(*cmd.text))
          if (!trim(l).empty()) found.push_back(trim(l));
      }
    }
    if (!known) {
      found = find_libcufile(root);
      std::error_code ec;
      // A capture without any library folder says nothing about libcufile.
      known = root.live() || !root.list("usr", ec).empty();
      if (root.live()) {
        std::string listing;
        for (const auto& p : found) listing += p + "\n";
        root.record("commands/libcufile.txt", listing);
      }
    }
    if (!found.empty()) {
      c.state = status::ok;
      std::string best = found.back();
      c.summary = "found " + best;
      c.evidence.push_back({"commands/libcufile.txt", 0, best});
    } else if (known) {
      c.state = status::fail;
      c.summary = "libcufile.so not found: cuFile cannot be used";
      c.fix = "Install the GDS user-space library (apt install libcufile-<cuda-ver> or the CUDA toolkit's gds component).";
    } else {
      c.summary = "libcufile not recorded in this capture";
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"userspace.udev", "udev database", status::unknown, impact::cufile, "", {}, ""};
    auto r = root.command("run-udev-data");
    std::optional<std::size_t> entries;
    if (r.ok()) {
      auto lines = split_lines(*r.text);
      if (r.text->find("No such file") != std::string::npos || r.text->find("cannot access") != std::string::npos) {
        c.evidence.push_back({"commands/run-udev-data.txt", 1, lines.empty() ? "" : trim(lines[0])});
      } else {
        std::size_t n = 0;
        for (const auto& l : lines)
          if (!trim(l).empty() && trim(l).rfind("total", 0) != 0) ++n;
        entries = n;
        c.evidence.push_back({"commands/run-udev-data.txt", 0, fmt::format("{} entries", n)});
      }
    } else {
      std::error_code ec;
      auto names = root.list("run/udev/data", ec);
      if (!ec) entries = names.size();
      else if (ec == std::errc::no_such_file_or_directory) c.evidence.push_back({"run/udev/data", 0, "absent"});
      else c.evidence.push_back({"run/udev/data", 0, ec.message()});
      if (ec && ec != std::errc::no_such_file_or_directory) c.summary = "/run/udev/data not readable";
    }
    if (!c.summary.empty()) {
      out.checks.push_back(std::move(c));
    } else {
      if (entries && *entries > 0) {
        f.udev_database = true;
        c.state = status::ok;
        c.summary = fmt::format("/run/udev/data present ({} entries)", *entries);
      } else {
        f.udev_database = false;
        c.state = status::fail;
        c.summary = "/run/udev/data missing or empty: cuFileHandleRegister fails with 5027 (udev property not found: ID_FS_USAGE)";
        c.fix = "Run systemd-udevd (or bind-mount /run/udev read-only into the container); on a VM without udev, write "
                "/run/udev/data/b<maj>:<min> with E:ID_FS_USAGE=filesystem and E:ID_FS_TYPE=<fs> for the file's device.";
      }
      out.checks.push_back(std::move(c));
    }
  }

  if (f.route.nvfs()) {
    // libcufile reaches nvidia-fs through /dev/nvidia-fs*; a container (or a host without udev) can have the
    // module loaded and no device nodes.
    check c{"userspace.nvfs_devices", "nvidia-fs device nodes", status::unknown, impact::direct, "", {}, ""};
    auto r = root.command("dev-nvidia-fs");
    if (!r.ok()) {
      c.summary = "the /dev/nvidia-fs* nodes were not recorded";
      c.fix = "List them (ls /dev/nvidia-fs*), or capture again with this gdskit doctor.";
    } else {
      std::size_t n = 0;
      for (const auto& l : split_lines(*r.text))
        if (trim(l).rfind("nvidia-fs", 0) == 0) ++n;
      c.evidence.push_back({"commands/dev-nvidia-fs.txt", 0, fmt::format("{} node(s)", n)});
      if (n > 0) {
        c.state = status::ok;
        c.summary = fmt::format("{} /dev/nvidia-fs* node(s)", n);
      } else {
        c.state = status::fail;
        c.summary = "nvidia-fs is loaded but /dev/nvidia-fs* is missing here: libcufile cannot reach it and runs in "
                    "compat mode (and its error path closes the process's fd 0)";
        c.fix = root.exists(".dockerenv") || root.exists("run/.containerenv")
                    ? "Start the container with the nodes: --device /dev/nvidia-fs0 ... --device /dev/nvidia-fs15 (all "
                      "of them), or the NVIDIA container toolkit's GDS option."
                    : "Recreate the nodes (reload nvidia-fs: modprobe -r nvidia-fs && modprobe nvidia-fs) and check that "
                      "udev runs.";
      }
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"userspace.environment", "Container / WSL", status::ok, impact::direct, "", {}, ""};
    auto rel = root.read("proc/sys/kernel/osrelease");
    std::string release = rel.ok() ? trim(*rel.text) : "";
    if (release.find("microsoft") != std::string::npos || release.find("WSL") != std::string::npos) {
      c.state = status::fail;
      c.summary = "WSL kernel: GPUDirect Storage is not available under WSL";
      c.evidence.push_back({"proc/sys/kernel/osrelease", 1, release});
      c.fix = "Run on native Linux.";
    } else if (root.exists(".dockerenv") || root.exists("run/.containerenv")) {
      c.state = status::warn;
      c.summary = "inside a container: /dev/nvidia-fs*, /run/udev and /proc/driver/nvidia-fs must be passed in";
      const std::string marker = root.exists(".dockerenv") ? ".dockerenv" : "run/.containerenv";
      c.evidence.push_back({marker, 0, "present"});
      root.record(marker, "");  // so a capture made in a container says so too
      c.fix = "Start the container with --device /dev/nvidia-fs0..15 and -v /run/udev:/run/udev:ro.";
    } else {
      c.summary = "not a container, not WSL";
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"userspace.memlock", "memlock limit", status::unknown, impact::none, "", {}, ""};
    auto r = root.command("ulimit-l");
    if (r.ok()) {
      std::string v = trim(*r.text);
      c.evidence.push_back({"commands/ulimit-l.txt", 1, v});
      auto kib = parse_u64(v);
      if (v == "unlimited") {
        c.state = status::ok;
        c.summary = "memlock unlimited";
      } else if (kib) {
        c.state = *kib >= 64 * 1024 ? status::ok : status::warn;
        c.summary = fmt::format("memlock {} KiB", *kib);
        if (c.state == status::warn) {
          c.summary += ": pinned host bounce buffers (compat, staged path) will be small";
          c.fix = "Raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf; --ulimit memlock=-1 for Docker).";
        }
      } else {
        c.summary = "memlock limit unreadable: " + v;
      }
    } else {
      c.summary = "memlock limit not recorded";
    }
    out.checks.push_back(std::move(c));
  }
}

}  // namespace gdskit::doctor
