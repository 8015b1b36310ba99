// The flags of `gdskit bench kv`, registered on the CLI's parser (CLI11) and checked before anything runs.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "bench/bench.hpp"
#include "bench/kv_bench.hpp"
#include "tools/flag_errors.hpp"
#include "tools/shell_text.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::bench {

namespace {

struct kv_flag_values {
  kv_options o;
  std::vector<std::string> dirs;
  std::string block_sizes = "64K,2M,8M";
  std::string capacity = "1G";
  std::string mixes;
  std::string durability = "cache";
  std::string crash_child;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const auto comma = text.find(',', pos);
    const std::string part = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    out.push_back(part);  // an empty item stays, to be refused by name
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Before anything is written: each --dir a different folder, writable, free of an earlier run's files (the
// bench removes only what it makes), with room for the store.
void check_folders(const kv_options& o) {
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& d : o.dirs) {
    struct stat st {};
    if (::stat(d.c_str(), &st) != 0) throw usage_error(fmt::format("--dir {}: {}", d.string(), std::strerror(errno)));
    if (!seen.insert({st.st_dev, st.st_ino}).second) {
      throw usage_error(fmt::format("--dir {}: given twice (the same folder under two names counts once)", d.string()));
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(d, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("gdskit-kv-bench-", 0) == 0) {
        throw usage_error(fmt::format("--dir {}: holds {} (from an earlier run, or someone's): remove it first; the "
                                      "bench only removes what it makes", d.string(), name));
      }
    }
    const std::filesystem::path probe = d / fmt::format("gdskit-kv-bench-probe-{}", ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw usage_error(fmt::format("--dir {}: cannot write there ({})", d.string(), std::strerror(errno)));
    ::close(fd);
    ::unlink(probe.c_str());
    struct statvfs fs {};
    const std::uint64_t share = o.capacity_bytes / o.dirs.size();
    if (::statvfs(d.c_str(), &fs) == 0) {
      const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (share > free_bytes) {
        throw usage_error(fmt::format("--capacity {}: {} of it goes in {}, which has {} free", format_size(o.capacity_bytes),
                                      format_size(share), d.string(), format_size(free_bytes)));
      }
    }
  }
}

kv_options finish(const kv_flag_values& v) {
  kv_options o = v.o;
  if (v.dirs.empty()) throw usage_error("--dir is required: a folder on the device to measure (repeat it to stripe over several)");
  o.dirs.clear();
  for (const auto& d : v.dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec)) throw usage_error(fmt::format("--dir {}: not a folder", d));
    o.dirs.emplace_back(d);
  }
  o.block_bytes.clear();
  for (const auto& b : split(v.block_sizes)) {
    if (b.empty()) throw usage_error(fmt::format("--block-sizes '{}': an empty item", v.block_sizes));
    const auto n = parse_size(b);
    if (!n || *n == 0 || *n > (std::uint64_t{1} << 30)) {
      throw usage_error(fmt::format("--block-sizes: '{}' is not a size of 1 byte .. 1 GiB", b));
    }
    o.block_bytes.push_back(*n);
  }
  if (o.block_bytes.empty()) throw usage_error("--block-sizes: give at least one size");
  const auto cap = parse_size(v.capacity);
  if (!cap) throw usage_error(fmt::format("--capacity: '{}' is not a size", v.capacity));
  o.capacity_bytes = *cap;
  if (v.crash_child.empty()) check_folders(o);
  for (std::uint64_t b : o.block_bytes) {
    // At least a few blocks per folder, or the phases have nothing to measure.
    if (o.capacity_bytes / o.dirs.size() < 8 * (b + 8192) + (64 << 10)) {
      throw usage_error(fmt::format("--capacity {} holds fewer than 8 blocks of {} per folder", format_size(o.capacity_bytes),
                                    format_size(b)));
    }
  }
  if (!v.mixes.empty()) {
    o.mixes = split(v.mixes);
    for (const auto& m : o.mixes) {
      if (m.empty()) throw usage_error(fmt::format("--mix '{}': an empty item", v.mixes));
      const auto& all = kv_all_mixes();
      if (std::find(all.begin(), all.end(), m) == all.end()) {
        throw usage_error(fmt::format("--mix: unknown phase '{}' (put, get, mix, churn, crash, faults, baseline)", m));
      }
    }
  }
  if (v.durability == "cache") {
    o.mode = kv::durability::cache;
  } else if (v.durability == "persist") {
    o.mode = kv::durability::persist;
  } else {
    throw usage_error(fmt::format("--durability: '{}' (cache or persist)", v.durability));
  }
  if (!(o.seconds > 0) || o.seconds > 3600) throw usage_error("--seconds: 0 < S <= 3600");
  if (o.threads == 0 || o.threads > 256) throw usage_error("--threads: 1 .. 256");
  if (o.in_flight == 0 || o.in_flight > 16) throw usage_error("--in-flight: 1 .. 16");
  if (o.batch > 1024) throw usage_error("--batch: 0 (automatic) .. 1024");
  if (!(o.zipf > 0) || o.zipf > 5) throw usage_error("--zipf: 0 < S <= 5");
  if (!(o.get_fraction >= 0) || o.get_fraction > 1) throw usage_error("--get-fraction: 0 .. 1");
  if (o.kills == 0 || o.kills > 100) throw usage_error("--kills: 1 .. 100");
  o.crash_child_progress = v.crash_child;
  if (!v.crash_child.empty() && (o.block_bytes.size() != 1 || o.batch == 0)) {
    throw usage_error("--crash-child needs one block size and --batch");
  }
  return o;
}

}  // namespace

std::function<kv_options()> add_kv_flags(CLI::App& cmd) {
  auto v = std::make_shared<kv_flag_values>();
  cmd.add_option("--dir", v->dirs, "store folder on the device to measure (repeat: one per device, striped); the bench "
                                   "makes gdskit-kv-bench-* folders in it and removes them at the end")
      ->type_name("DIR");
  cmd.add_option("--block-sizes", v->block_sizes, "block sizes to run, in turn (default 64K,2M,8M)")->type_name("LIST");
  cmd.add_option("--capacity", v->capacity, "store capacity, all folders together (default 1G)")->type_name("SIZE");
  cmd.add_option("--mix", v->mixes, "phases (default all): put (put storm into an empty store), get (cold gets), mix "
                                    "(gets and puts with Zipf reuse), churn (puts into a full store), crash (kill -9 "
                                    "of a writer, reopen), faults (ENOSPC, EIO, slow device), baseline (a file per "
                                    "block, temporary name + rename, plain reads)")
      ->type_name("LIST");
  cmd.add_option("--seconds", v->o.seconds, "length of each timed phase (default 3)")
      ->type_name("S")
      ->check(tools::real_number());
  cmd.add_option("--threads", v->o.threads, "callers (default 4)")
      ->type_name("N")
      ->check(tools::whole_number<unsigned>());
  cmd.add_option("--in-flight", v->o.in_flight,
                 "calls each caller keeps in flight through submit_put / submit_get, filling and checking blocks "
                 "meanwhile (default 2; 1: blocking put / get; the baseline runs threads x this many callers)")
      ->type_name("N")
      ->check(tools::whole_number<unsigned>());
  cmd.add_option("--batch", v->o.batch, "keys per call, 1 .. 1024 (default 0: as many as make 8 MiB, 1 .. 64)")
      ->type_name("N")
      ->check(tools::whole_number<unsigned>());
  cmd.add_option("--zipf", v->o.zipf, "Zipf exponent of the mix's key choice (default 0.99)")
      ->type_name("S")
      ->check(tools::real_number());
  cmd.add_option("--get-fraction", v->o.get_fraction, "share of the mix's calls that are gets (default 0.7)")
      ->type_name("F")
      ->check(tools::real_number());
  cmd.add_option("--kills", v->o.kills, "writers killed with SIGKILL in the crash phase (default 3)")
      ->type_name("N")
      ->check(tools::whole_number<unsigned>());
  // A GPU index, as bench's -d takes it: a negative number would be the option's "host memory" and run silently there.
  cmd.add_option("--gpu", v->o.gpu, "blocks in the memory of this GPU, 0 .. 1023 (default: host memory)")
      ->type_name("N")
      ->check(tools::whole_number(0, 1023));
  cmd.add_option("--durability", v->durability, "cache (never syncs; default) or persist (fdatasync)")->type_name("MODE");
  cmd.add_option("--seed", v->o.seed, "seed of the random choices (default 1)")
      ->type_name("N")
      ->check(tools::whole_number<std::uint64_t>());
  cmd.add_flag("--json", v->o.json, "one JSON document on stdout");
  cmd.add_flag("--keep", v->o.keep, "leave the store and the baseline's files in the folders");
  cmd.add_option("--crash-child", v->crash_child, "")->group("");  // the crash phase's writer: the bench itself
  return [v] { return finish(*v); };
}

}  // namespace gdskit::bench
