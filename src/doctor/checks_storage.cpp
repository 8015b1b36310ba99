// Storage layer for --path: mount, file system and options, block-device chain, NVMe, PCIe placement
// against the GPUs, and the udev entry cuFile needs to register files on it.
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "doctor/checks.hpp"
#include "engine/device_profile.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::doctor {
namespace {

struct mount_entry {
  int line = 0;
  std::string text;
  std::string dev;  // "254:0"
  std::string mount_point;
  std::string mount_options;
  std::string fs_type;
  std::string source;
  std::string super_options;
};

std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    // The kernel writes space, tab, newline and backslash as \ooo: exactly three octal digits.
    auto octal = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>(((s[i + 1] - '0') << 6) | ((s[i + 2] - '0') << 3) | (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<std::string> fields(const std::string& l) {
  std::vector<std::string> out;
  std::string tok;
  for (char c : l + " ") {
    if (c == ' ' || c == '\t') {
      if (!tok.empty()) out.push_back(tok);
      tok.clear();
    } else {
      tok += c;
    }
  }
  return out;
}

std::optional<mount_entry> parse_mountinfo_line(const std::string& l, int line) {
  auto f = fields(l);
  auto dash = std::find(f.begin(), f.end(), "-");
  if (f.size() < 10 || dash == f.end() || dash - f.begin() < 6 || f.end() - dash < 4) return std::nullopt;
  mount_entry m;
  m.line = line;
  m.text = trim(l);
  m.dev = f[2];
  m.mount_point = unescape(f[4]);
  m.mount_options = f[5];
  m.fs_type = *(dash + 1);
  m.source = unescape(*(dash + 2));
  m.super_options = *(dash + 3);
  if (m.mount_point.empty() || m.mount_point[0] != '/') return std::nullopt;
  return m;
}

bool under(const std::string& path, const std::string& mount_point) {
  if (mount_point == "/") return true;
  return path == mount_point || path.rfind(mount_point + "/", 0) == 0;
}

std::string option_value(const std::string& opts, const std::string& key) {
  std::string s = "," + opts + ",";
  auto p = s.find("," + key + "=");
  if (p == std::string::npos) return {};
  auto start = p + key.size() + 2;
  return s.substr(start, s.find(',', start) - start);
}


}  // namespace

layer check_storage(system_root& root, facts& f, const std::string& path) {
  layer out{"storage", "Storage for " + path, {}};

  std::optional<mount_entry> mnt;
  {
    check c{"storage.mount", "Mount", status::unknown, impact::none, "", {}, ""};
    auto r = root.read("proc/self/mountinfo");
    if (r.ok()) {
      auto lines = split_lines(*r.text);
      for (std::size_t i = 0; i < lines.size(); ++i) {
        auto m = parse_mountinfo_line(lines[i], static_cast<int>(i + 1));
        // The last matching mount with the longest mount point is the one that covers the path.
        if (m && under(path, m->mount_point) && (!mnt || m->mount_point.size() >= mnt->mount_point.size())) mnt = m;
      }
    }
    if (mnt) {
      c.state = status::ok;
      c.summary = fmt::format("{} on {} ({}, dev {}, options {}, {})", mnt->source, mnt->mount_point, mnt->fs_type,
                              mnt->dev, mnt->mount_options, mnt->super_options);
      c.evidence.push_back({"proc/self/mountinfo", mnt->line, mnt->text});
    } else {
      c.summary = r.ok() ? "no mount in proc/self/mountinfo covers " + path : "proc/self/mountinfo not readable";
    }
    out.checks.push_back(std::move(c));
  }
  if (!mnt) return out;

  {
    check c{"storage.filesystem", "File system", status::ok, impact::direct, "", {}, ""};
    c.evidence.push_back({"proc/self/mountinfo", mnt->line, mnt->fs_type + " " + mnt->super_options});
    const std::string& t = mnt->fs_type;
    std::string data = option_value(mnt->super_options, "data");
    if (data.empty()) data = option_value(mnt->mount_options, "data");
    if (t == "ext4") {
      if (data == "ordered") {
        c.summary = "ext4 with data=ordered";
      } else if (data.empty()) {
        c.state = status::warn;
        c.summary = "ext4 without an explicit data=ordered option: cuFile looks for it in the mount table";
        c.fix = "Remount with data=ordered written out (mount -o remount,data=ordered, or in /etc/fstab).";
      } else {
        c.state = status::fail;
        c.summary = "ext4 with data=" + data + ": GDS needs data=ordered";
        c.fix = "Mount with data=ordered.";
      }
    } else if (t == "xfs") {
      c.summary = "xfs";
    } else if (t == "tmpfs" || t == "ramfs" || t == "overlay" || t == "squashfs" || t == "proc" || t == "sysfs") {
      c.state = status::fail;
      c.summary = t + ": not a block file system cuFile can drive (no O_DIRECT to a device)";
      c.fix = "Put the data on ext4 (data=ordered) or xfs on a local NVMe.";
    } else if (t == "nfs" || t == "nfs4" || t == "lustre" || t == "beegfs" || t == "gpfs" || t == "wekafs") {
      c.state = status::warn;
      c.summary = t + ": distributed file system, needs its own GDS-enabled client";
    } else {
      c.state = status::fail;
      c.summary = t + ": not supported by GDS (ext4 and xfs on NVMe are)";
      c.fix = "Put the data on ext4 (data=ordered) or xfs on a local NVMe.";
    }
    out.checks.push_back(std::move(c));
  }

  // Block device chain, from maj:min through dm/md slaves to the physical devices.
  std::error_code ec;
  auto blocks = root.list("sys/block", ec);
  std::string top, part;  // whole-disk name of the mount's device, and the partition (if any)
  for (const auto& b : blocks) {
    auto d = root.read("sys/block/" + b + "/dev");
    if (d.ok() && trim(*d.text) == mnt->dev) top = b;
    if (!top.empty()) break;
    std::error_code ec2;
    for (const auto& p : root.list("sys/block/" + b, ec2)) {
      if (p.rfind(b, 0) != 0 || p == b) continue;
      auto pd = root.read("sys/block/" + b + "/" + p + "/dev");
      if (pd.ok() && trim(*pd.text) == mnt->dev) {
        top = b;
        part = p;
        break;
      }
    }
    if (!top.empty()) break;
  }
  std::vector<std::string> leaves;
  std::vector<std::string> chain;
  {
    check c{"storage.block_chain", "Block-device chain", status::ok, impact::direct, "", {}, ""};
    if (top.empty()) {
      c.state = mnt->dev.rfind("0:", 0) == 0 ? status::fail : status::unknown;
      c.summary = mnt->dev.rfind("0:", 0) == 0 ? "no block device (virtual file system, dev " + mnt->dev + ")"
                                                 : "block device " + mnt->dev + " not found under sys/block";
    } else {
      std::vector<std::string> todo{top};
      int guard = 0;
      while (!todo.empty() && ++guard < 64) {
        auto b = todo.back();
        todo.pop_back();
        chain.push_back(b);
        std::error_code sec;
        auto slaves = root.list("sys/block/" + b + "/slaves", sec);
        if (slaves.empty()) leaves.push_back(b);
        for (const auto& s : slaves) todo.push_back(s.rfind(b, 0) == 0 ? s : s);
      }
      c.evidence.push_back({"sys/block/" + top + "/dev", 1, mnt->dev});
      c.summary = fmt::format("{}{} -> {}", part.empty() ? "" : part + " on ", top, fmt::join(chain, " -> "));
      if (top.rfind("dm-", 0) == 0) {
        c.state = status::fail;
        c.summary += ": device-mapper (LVM, crypt) is not supported by GDS";
        c.fix = "Use a plain NVMe partition or MD RAID0 for GDS data.";
      } else if (top.rfind("md", 0) == 0) {
        c.state = status::warn;
        c.summary += ": MD RAID works for GDS only as RAID0 with the mdadm udev rule";
      } else if (top.rfind("loop", 0) == 0) {
        c.state = status::fail;
        c.summary += ": loop device, no DMA to a real device";
      }
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"storage.nvme", "NVMe", status::unknown, impact::direct, "", {}, ""};
    if (!leaves.empty()) {
      bool all_nvme = std::all_of(leaves.begin(), leaves.end(), [](const std::string& l) { return l.rfind("nvme", 0) == 0; });
      c.evidence.push_back({"sys/block", 0, fmt::format("{}", fmt::join(leaves, " "))});
      if (all_nvme) {
        c.state = status::ok;
        c.summary = fmt::format("on NVMe: {}", fmt::join(leaves, ", "));
        for (const auto& l : leaves) {
          auto integ = root.read("sys/block/" + l + "/integrity/device_is_integrity_capable");
          if (integ.ok() && trim(*integ.text) == "1") {
            c.state = status::fail;
            c.summary += "; " + l + " is integrity-capable (metadata LBA format): GDS writes fail";
            c.fix = "Reformat the namespace to an LBA format with 0 bytes of metadata (nvme format).";
          }
        }
      } else {
        c.state = status::fail;
        c.summary = fmt::format("{} is not NVMe: nvidia-fs and P2PDMA drive NVMe only", fmt::join(leaves, ", "));
        c.fix = "Put the data on a local NVMe drive.";
      }
    } else {
      c.summary = "no block device to check";
    }
    out.checks.push_back(std::move(c));
  }

  {
    check c{"storage.topology", "PCIe placement vs GPUs", status::unknown, impact::none, "", {}, ""};
    std::vector<std::string> notes;
    bool any_cross = false, any_same = false;
    for (const auto& l : leaves) {
      auto rp = root.real_path("sys/block/" + l);
      if (!rp.ok()) continue;
      c.evidence.push_back({"sys/block/" + l + "/realpath.txt", 1, *rp.text});
      std::string bdf = last_bdf_in(*rp.text), rc = root_complex_in(*rp.text);
      if (bdf.empty()) {
        notes.push_back(l + " is not on PCIe");
        continue;
      }
      for (const auto& g : f.gpus) {
        std::string grc = root_complex_in(g.sys_path);
        if (grc.empty() || rc.empty()) {
          notes.push_back(fmt::format("{} at {}: root complex of GPU {} unknown", l, bdf, g.bdf));
        } else if (grc == rc) {
          any_same = true;
          notes.push_back(fmt::format("{} at {} shares root complex {} with GPU {}", l, bdf, rc, g.bdf));
        } else {
          any_cross = true;
          notes.push_back(fmt::format("{} at {} ({}) and GPU {} ({}) are on different root complexes", l, bdf, rc, g.bdf, grc));
        }
      }
      if (f.gpus.empty()) notes.push_back(fmt::format("{} at {} ({})", l, bdf, rc));
    }
    if (any_cross) {
      c.state = status::warn;
      c.fix = "Prefer a GPU and NVMe under the same root complex or PCIe switch (nvidia-smi topo -m: PIX/PXB).";
    } else if (any_same) {
      c.state = status::ok;
    }
    c.summary = notes.empty() ? "placement unknown" : fmt::format("{}", fmt::join(notes, "; "));
    out.checks.push_back(std::move(c));
  }

  {
    check c{"storage.udev_entry", "udev entry for the device", status::unknown, impact::cufile, "", {}, ""};
    const std::string rel = "run/udev/data/b" + mnt->dev;
    auto r = root.read(rel, 64 * 1024);
    if (r.ok()) {
      auto lines = split_lines(*r.text);
      int line = 0;
      for (std::size_t i = 0; i < lines.size(); ++i)
        if (lines[i].rfind("E:ID_FS_USAGE=", 0) == 0) line = static_cast<int>(i + 1);
      if (line > 0) {
        c.state = status::ok;
        c.summary = "udev entry b" + mnt->dev + " has ID_FS_USAGE";
        c.evidence.push_back({rel, line, lines[static_cast<std::size_t>(line - 1)]});
      } else {
        c.state = status::fail;
        c.summary = "udev entry b" + mnt->dev + " lacks ID_FS_USAGE: cuFileHandleRegister fails with 5027";
        c.evidence.push_back({rel, 0, "no E:ID_FS_USAGE"});
      }
    } else if (f.udev_database && !*f.udev_database) {
      c.state = status::fail;
      c.summary = "no udev entry b" + mnt->dev + " (no udev database): cuFile cannot register files here";
      c.evidence.push_back({rel, 0, "absent"});
    } else if (f.udev_database && *f.udev_database) {
      c.state = root.live() ? status::fail : status::unknown;
      c.summary = root.live() ? "no udev entry b" + mnt->dev + ": cuFileHandleRegister fails with 5027"
                              : "udev entry b" + mnt->dev + " not in this capture";
    } else {
      c.summary = "udev entry not checked";
    }
    if (c.state == status::fail)
      c.fix = "Let udevd populate /run/udev/data (udevadm trigger), or write /run/udev/data/b" + mnt->dev +
              " with E:ID_FS_USAGE=filesystem and E:ID_FS_TYPE=" + mnt->fs_type + ".";
    if (mnt->dev.rfind("0:", 0) == 0) {
      c.state = status::fail;
      c.summary = "virtual file system (dev " + mnt->dev + "): cuFile cannot register its files";
    }
    out.checks.push_back(std::move(c));
  }
  // The I/O profile transfers on this device start from (live systems only: it lives in this user's cache).
  if (struct stat st {}; root.live() && ::stat(path.c_str(), &st) == 0) {
    const auto& p = engine::profile_for_device(st.st_dev);
    check c{"storage.profile", "I/O profile", status::ok, impact::none, "", {}, ""};
    c.summary = p.profile ? fmt::format("device profile {}: read depth {}, {}; write depth {}, {}; adaptive from there",
                                        p.profile->device.block.empty() ? p.profile->device.key : p.profile->device.block,
                                        p.profile->read.depth, format_size(p.profile->read.request_bytes),
                                        p.profile->write.depth, format_size(p.profile->write.request_bytes))
                          : fmt::format("{}; adaptive from depth {}, {}", p.reason, engine::k_start_shape.depth,
                                        format_size(engine::k_start_shape.request_bytes));
    if (!p.profile) {
      // What the library itself learned here (the start of the next transfer when no tuned profile exists).
      const engine::learned_result l = engine::learned_profile_for_device(st.st_dev);
      if (l.learned && !l.learned->shapes.empty() && default_settings().learn) {
        c.summary = fmt::format("{}; learned here:", p.reason);
        std::string sep = " ";
        for (const auto& [key, ls] : l.learned->shapes) {
          c.summary += fmt::format("{}{} depth {}, {} at {:.2f} GiB/s ({})", sep, key, ls.shape.depth,
                                   format_size(ls.shape.request_bytes), ls.gib_per_s, ls.updated);
          sep = "; ";
        }
      } else if (!l.reason.empty() && l.reason != "nothing learned yet") {
        c.summary += "; " + l.reason;
      }
      c.fix = "gdskit tune --path " + path + " measures this device and saves its profile.";
    }
    out.checks.push_back(std::move(c));
  }
  return out;
}

}  // namespace gdskit::doctor
