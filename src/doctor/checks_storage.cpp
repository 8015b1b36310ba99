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


// The whole-disk name of a partition ("nvme0n1p2" -> "nvme0n1", "sda1" -> "sda"); the name itself otherwise.
std::string disk_of(const std::string& name) {
  if (name.rfind("nvme", 0) == 0) {
    const auto p = name.rfind('p');
    if (p != std::string::npos && p > 4 && p + 1 < name.size() &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(p + 1), name.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }))
      return name.substr(0, p);
    return name;
  }
  std::size_t end = name.size();
  while (end > 0 && std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  return end > 0 && end < name.size() && name.rfind("sd", 0) == 0 ? name.substr(0, end) : name;
}

struct judged_layers {
  status state = status::ok;
  std::string summary;
  std::vector<source_ref> evidence;
  std::string fix;
};

// The block layers between the file system and the NVMe devices, judged for the route a read takes: the
// nvidia-fs route supports partitions, MD RAID0 (with the mdadm udev rule) and NVMe-oF over RDMA (with the
// nvme_rdma hook); the PCI P2PDMA route supports partitions of local PCIe NVMe only (no RAID at all, no
// NVMe-oF, no native NVMe multipath). device-mapper (LVM, dm-crypt, dm-multipath) and loop devices are on no route.
judged_layers judge_block_layers(system_root& root, const facts& f, const std::vector<std::string>& chain, const std::vector<std::string>& leaves,
                                 bool partition) {
  judged_layers j;
  const bool p2pdma = f.route.p2pdma();
  const std::string route = p2pdma ? "the PCI P2PDMA route" : "the nvidia-fs route";
  std::vector<std::string> layers, bad;
  auto worse = [&](status st) {
    auto rank = [](status x) { return x == status::fail ? 3 : x == status::unknown ? 2 : x == status::warn ? 1 : 0; };
    if (rank(st) > rank(j.state)) j.state = st;
  };
  if (partition) layers.push_back("partition");
  for (const auto& b : chain) {
    const std::string base = "sys/block/" + b;
    if (b.rfind("dm-", 0) == 0) {
      auto uuid = root.read(base + "/dm/uuid", 4096);
      auto name = root.read(base + "/dm/name", 4096);
      const std::string u = uuid.ok() ? trim(*uuid.text) : "";
      const std::string kind = u.rfind("LVM-", 0) == 0      ? "LVM (device-mapper)"
                               : u.rfind("CRYPT-", 0) == 0  ? "dm-crypt (device-mapper)"
                               : u.rfind("mpath-", 0) == 0  ? "dm-multipath (device-mapper)"
                                                            : "device-mapper";
      layers.push_back(fmt::format("{} {}", kind, name.ok() ? trim(*name.text) : b));
      if (uuid.ok()) j.evidence.push_back({base + "/dm/uuid", 1, u});
      bad.push_back(fmt::format("{} ({}) is on no GDS route: cuFile says \"Unsupported block device\"", kind, b));
      worse(status::fail);
    } else if (b.rfind("md", 0) == 0) {
      auto level = root.read(base + "/md/level", 4096);
      const std::string lv = level.ok() ? trim(*level.text) : "";
      layers.push_back("MD " + (lv.empty() ? std::string("RAID (level unknown)") : lv));
      if (level.ok()) j.evidence.push_back({base + "/md/level", 1, lv});
      if (p2pdma) {
        bad.push_back(fmt::format("MD RAID ({}) is not supported by the PCI P2PDMA route at all (x86)", b));
        worse(status::fail);
      } else if (lv.empty()) {
        bad.push_back(fmt::format("the RAID level of {} is not known: only RAID0 is supported", b));
        worse(status::unknown);
      } else if (lv != "raid0") {
        bad.push_back(fmt::format("{} is {}: GDS supports MD RAID0 only", b, lv));
        worse(status::fail);
      }
    } else if (b.rfind("loop", 0) == 0) {
      layers.push_back("loop");
      bad.push_back("a loop device has no DMA to a real device");
      worse(status::fail);
    }
  }
  // NVMe transport of each NVMe leaf: the controller's transport file, else where its sysfs folder lives.
  for (const auto& l : leaves) {
    if (l.rfind("nvme", 0) != 0) continue;
    const std::string disk = disk_of(l);
    std::string transport;
    if (auto t = root.read("sys/block/" + disk + "/device/transport", 256); t.ok()) {
      transport = trim(*t.text);
      j.evidence.push_back({"sys/block/" + disk + "/device/transport", 1, transport});
    } else if (auto rp = root.real_path("sys/block/" + disk); rp.ok()) {
      transport = rp.text->find("nvme-fabrics") != std::string::npos ? "fabrics" : !last_bdf_in(*rp.text).empty() ? "pcie" : "";
    }
    if (transport.empty() || transport == "pcie") continue;
    layers.push_back(fmt::format("NVMe-oF ({}) {}", transport, disk));
    if (p2pdma) {
      bad.push_back(fmt::format("{} is NVMe over fabrics ({}): the PCI P2PDMA route does not support NVMe-oF", disk, transport));
      worse(status::fail);
    } else if (transport == "rdma" && f.route.nvme_rdma_hook) {
      continue;
    } else if (transport == "rdma") {
      bad.push_back(fmt::format("{} is NVMe over RDMA but nvme_rdma exports no nvfs hook (MOFED/DOCA nvme-rdma with GDS "
                                "support needed)", disk));
      worse(status::fail);
    } else {
      bad.push_back(fmt::format("{} is NVMe over {}: only NVMe-oF over RDMA is supported (nvidia-fs route)", disk, transport));
      worse(status::fail);
    }
  }
  // Native NVMe multipath: the P2PDMA route needs it off.
  if (p2pdma && std::any_of(leaves.begin(), leaves.end(), [](const std::string& l) { return l.rfind("nvme", 0) == 0; })) {
    const std::string mp = "sys/module/nvme_core/parameters/multipath";
    if (auto r = root.read(mp, 16); r.ok()) {
      j.evidence.push_back({mp, 1, trim(*r.text)});
      if (trim(*r.text) == "Y") {
        bad.push_back("native NVMe multipath is on (nvme_core multipath=Y): the PCI P2PDMA route needs it off");
        worse(status::fail);
      }
    } else {
      bad.push_back("nvme_core multipath not known: the PCI P2PDMA route needs multipath=N");
      worse(status::unknown);
    }
  }
  const std::string shape = layers.empty() ? "no partition, RAID, LVM or NVMe-oF" : fmt::format("{}", fmt::join(layers, ", "));
  if (bad.empty()) {
    j.summary = fmt::format("{}: no block layer {} refuses", shape, route);
  } else {
    j.summary = fmt::format("{} on {}: {}", shape, route, fmt::join(bad, "; "));
    j.fix = j.state == status::unknown
                ? "Read the RAID level (/sys/block/<md>/md/level) or /sys/module/nvme_core/parameters/multipath."
            : p2pdma ? "Put the data on a partition (or whole namespace) of a local PCIe NVMe without RAID or LVM, with "
                       "options nvme_core multipath=N; or use the nvidia-fs route, which supports MD RAID0."
                     : "Put the data on a plain NVMe partition or an MD RAID0 of NVMe (with the mdadm udev rule); "
                       "device-mapper and other RAID levels are not supported.";
  }
  return j;
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
      c.summary = t + ": network file system, needs its own GDS-enabled client (see storage.network_fs)";
    } else {
      c.state = status::fail;
      c.summary = t + ": not supported by GDS (ext4 and xfs on NVMe are)";
      c.fix = "Put the data on ext4 (data=ordered) or xfs on a local NVMe.";
    }
    out.checks.push_back(std::move(c));
  }

  // A network file system has no local block device: its GDS client registers with nvidia-fs instead.
  static const std::pair<const char*, const char*> network_fs[] = {
      {"nfs", "rpcrdma"}, {"nfs4", "rpcrdma"}, {"lustre", "lnet"}, {"beegfs", "beegfs"}, {"gpfs", "mmfslinux"},
      {"wekafs", "wekafsio"}};
  for (const auto& [fs_type, client] : network_fs) {
    if (mnt->fs_type != fs_type) continue;
    check c{"storage.network_fs", "Network file system client", status::unknown, impact::direct, "", {}, ""};
    const bool nfs = mnt->fs_type.rfind("nfs", 0) == 0;
    const std::string opts = "," + mnt->super_options + "," + mnt->mount_options + ",";
    auto m = root.read("proc/driver/nvidia-fs/modules");
    const auto listed = m.ok() ? last_line_with(*m.text, std::string(client) + ":") : std::pair<int, std::string>{0, {}};
    if (nfs && opts.find(",proto=rdma,") == std::string::npos) {
      c.state = status::fail;
      c.summary = "NFS over TCP: GDS needs NFS over RDMA (proto=rdma)";
      c.evidence.push_back({"proc/self/mountinfo", mnt->line, mnt->super_options});
      c.fix = "Mount with -o proto=rdma (with MOFED/DOCA nfsrdma, or the storage vendor's GDS client).";
    } else if (!f.route.nvfs_loaded) {
      c.state = status::fail;
      c.summary = std::string(fs_type) + " reaches GPU memory only through nvidia-fs, which is not loaded";
      c.fix = "Load nvidia-fs (see kernel.nvidia_fs).";
    } else if (listed.first > 0) {
      c.state = status::ok;
      c.summary = fmt::format("{} client registered with nvidia-fs ({})", fs_type, client);
      c.evidence.push_back({"proc/driver/nvidia-fs/modules", listed.first, listed.second});
    } else {
      c.summary = fmt::format("nvidia-fs does not list {} (yet): the {} client's registration is not shown", client, fs_type);
      c.fix = fmt::format("Read /proc/driver/nvidia-fs/modules after a cuFile program used this mount; {} must appear.", client);
    }
    out.checks.push_back(std::move(c));
    return out;
  }

  // Block device chain, from maj:min through dm/md slaves to the physical devices.
  std::error_code ec;
  auto blocks = root.list("sys/block", ec, /*record_links=*/true);
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
    check c{"storage.block_chain", "Block layers on the route", status::ok, impact::direct, "", {}, ""};
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
        auto slaves = root.list("sys/block/" + b + "/slaves", sec, /*record_links=*/true);
        if (slaves.empty()) leaves.push_back(b);
        for (const auto& sl : slaves) todo.push_back(sl);
      }
      c.evidence.push_back({"sys/block/" + top + "/dev", 1, mnt->dev});
      for (const auto& l : leaves) {
        // What else holds the devices under the file system (an array or volume using them too).
        std::error_code hec;
        auto holders = root.list("sys/block/" + disk_of(l) + "/holders", hec, /*record_links=*/true);
        if (!holders.empty())
          c.evidence.push_back({"sys/block/" + disk_of(l) + "/holders", 0, fmt::format("{} held by {}", disk_of(l), fmt::join(holders, ", "))});
      }
      const std::string shape = fmt::format("{}{}", part.empty() ? "" : part + " on ", fmt::join(chain, " -> "));
      const judged_layers j = judge_block_layers(root, f, chain, leaves, !part.empty());
      c.state = j.state;
      c.summary = shape + ": " + j.summary;
      for (const auto& e : j.evidence) c.evidence.push_back(e);
      c.fix = j.fix;
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

  std::optional<bool> md_props;  // the udev entry carries what mdadm's rule imports
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
        md_props = std::any_of(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("E:MD_LEVEL=", 0) == 0; });
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
  if (top.rfind("md", 0) == 0 && !f.route.p2pdma() && md_props) {
    // cuFile learns an MD array's members from the properties mdadm's udev rule imports (MD_LEVEL, MD_DEVICES).
    check c{"storage.md_udev_rule", "mdadm udev rule", *md_props ? status::ok : status::fail, impact::direct, "", {}, ""};
    c.evidence.push_back({"run/udev/data/b" + mnt->dev, 0, *md_props ? "E:MD_LEVEL present" : "no E:MD_LEVEL"});
    c.summary = *md_props ? "the udev entry of " + top + " carries the mdadm properties"
                          : "the udev entry of " + top + " has no MD_LEVEL: the mdadm udev rule did not run, so cuFile "
                            "cannot see the array's NVMe members";
    if (!*md_props)
      c.fix = "Add IMPORT{program}=\"/usr/sbin/mdadm --detail --export $devnode\" to the md rules "
              "(63-md-raid-arrays.rules), then udevadm trigger.";
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
