// The doctor on fixture roots: each system state of the fixtures, hostile files, the real H200 capture, JSON golden
// output and the capture round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "doctor/checks.hpp"
#include "doctor/doctor.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gd = gdskit::doctor;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) { return fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/systems" / name; }

fs::path real_capture() {
  fs::path shared = fs::path(GDSKIT_SHARED_DIR) / "fixtures/systems/h200-vm-no-nvfs";
  if (fs::exists(shared / "README.md")) return shared;
  return fixture("h200-vm-no-nvfs");
}

gd::report diagnose(const fs::path& root) {
  auto r = gd::system_root::captured(root);
  return gd::diagnose(r, gd::default_path(r));
}

const gd::check* find(const gd::report& r, const std::string& id) {
  for (const auto& l : r.layers)
    for (const auto& c : l.checks)
      if (c.id == id) return &c;
  return nullptr;
}

gd::status state_of(const gd::report& r, const std::string& id) {
  auto* c = find(r, id);
  EXPECT_NE(c, nullptr) << id;
  return c != nullptr ? c->state : gd::status::unknown;
}

bool has_reason(const gd::report& r, const std::string& id) {
  return std::any_of(r.result.reasons.begin(), r.result.reasons.end(),
                     [&](const std::string& s) { return s.rfind(id + ":", 0) == 0; });
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(doctor, everything_fixed_is_true_gds) {
  auto r = diagnose(fixture("gds-ok-nvme-ext4"));
  EXPECT_EQ(r.result.kind, gd::verdict_kind::true_gds) << r.result.line;
  EXPECT_EQ(r.result.exit_code(), 0);
  EXPECT_EQ(r.result.line.rfind("true GDS (P2P DMA) works", 0), 0u);
  EXPECT_FALSE(r.result.proven);
  EXPECT_EQ(state_of(r, "kernel.nvidia_fs"), gd::status::ok);
  EXPECT_EQ(state_of(r, "kernel.nvme_hook"), gd::status::ok);
  EXPECT_EQ(state_of(r, "kernel.nvfs_modules"), gd::status::ok);
  EXPECT_EQ(state_of(r, "storage.filesystem"), gd::status::ok);
  EXPECT_EQ(state_of(r, "storage.nvme"), gd::status::ok);
  EXPECT_EQ(state_of(r, "storage.topology"), gd::status::ok);
  EXPECT_EQ(state_of(r, "storage.udev_entry"), gd::status::ok);
  EXPECT_EQ(state_of(r, "gpu.bar1"), gd::status::ok);
  EXPECT_EQ(r.path, "/data");
}

TEST(doctor, generic_kernel_without_hook_is_compat) {
  auto r = diagnose(fixture("generic-kernel-no-hook"));
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only) << r.result.line;
  EXPECT_EQ(r.result.first_failing_layer, "kernel");
  EXPECT_EQ(state_of(r, "kernel.nvme_hook"), gd::status::fail);
  // nvidia-fs does not list nvme: registration is not proven (it is judged from nvidia-fs's own list).
  EXPECT_EQ(state_of(r, "kernel.nvfs_modules"), gd::status::unknown);
  EXPECT_EQ(r.result.line.rfind("cuFile works only in compat mode", 0), 0u);
  EXPECT_EQ(r.result.exit_code(), 1);
}

TEST(doctor, iommu_on_is_compat) {
  auto r = diagnose(fixture("iommu-on"));
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only);
  EXPECT_EQ(state_of(r, "kernel.iommu"), gd::status::fail);
  EXPECT_TRUE(has_reason(r, "kernel.iommu"));
  EXPECT_FALSE(find(r, "kernel.iommu")->fix.empty());
}

TEST(doctor, bar1_256mib_warns_against_vram) {
  auto r = diagnose(fixture("bar1-256mib"));
  EXPECT_EQ(state_of(r, "gpu.bar1"), gd::status::warn);
  EXPECT_NE(find(r, "gpu.bar1")->summary.find("256 MiB < VRAM 12288 MiB"), std::string::npos);
  EXPECT_EQ(state_of(r, "gpu.class"), gd::status::warn);  // GeForce
}

TEST(doctor, nvidia_fs_missing_is_compat) {
  auto r = diagnose(fixture("nvfs-missing"));
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only);
  EXPECT_EQ(state_of(r, "kernel.nvidia_fs"), gd::status::fail);
  EXPECT_TRUE(has_reason(r, "kernel.nvidia_fs"));
}

TEST(doctor, p2p_einval_in_dmesg_is_compat_with_meaning) {
  auto r = diagnose(fixture("p2p-einval"));
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only);
  EXPECT_EQ(r.result.first_failing_layer, "logs");
  auto* c = find(r, "logs.dmesg_error");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->state, gd::status::fail);
  EXPECT_NE(c->summary.find("EINVAL"), std::string::npos);
  ASSERT_FALSE(c->evidence.empty());
  EXPECT_EQ(c->evidence[0].file, "commands/dmesg.txt");
  EXPECT_GT(c->evidence[0].line, 0);
}

TEST(doctor, real_h200_capture_is_not_gds_for_the_observed_reasons) {
  auto root = real_capture();
  ASSERT_TRUE(fs::exists(root / "proc/modules")) << root;
  auto r = diagnose(root);
  EXPECT_NE(r.result.kind, gd::verdict_kind::true_gds);
  EXPECT_EQ(r.result.exit_code(), 1);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::unusable) << r.result.line;
  EXPECT_EQ(r.result.first_failing_layer, "kernel");
  EXPECT_TRUE(has_reason(r, "kernel.nvidia_fs"));
  EXPECT_TRUE(has_reason(r, "kernel.nvme_hook"));
  EXPECT_TRUE(has_reason(r, "userspace.udev"));
  EXPECT_TRUE(has_reason(r, "storage.nvme"));  // virtio, not NVMe
  EXPECT_EQ(state_of(r, "kernel.iommu"), gd::status::ok);  // no IOMMU groups
  EXPECT_EQ(state_of(r, "gpu.bar1"), gd::status::ok);      // 262144 MiB
  EXPECT_NE(find(r, "gpu.bar1")->summary.find("262144 MiB"), std::string::npos);
  EXPECT_NE(find(r, "gpu.gsp")->summary.find("EnableGpuFirmware=18"), std::string::npos);
  EXPECT_NE(find(r, "gpu.driver")->summary.find("580.159.04 (open"), std::string::npos);
  EXPECT_NE(find(r, "storage.mount")->summary.find("/dev/vda"), std::string::npos);
}

TEST(doctor, garbage_files_do_not_crash_and_never_claim_gds) {
  auto r = diagnose(fixture("garbage-proc"));
  EXPECT_NE(r.result.kind, gd::verdict_kind::true_gds);
  EXPECT_FALSE(gd::render_text(r, false).empty());
  EXPECT_FALSE(gd::render_json(r).empty());
}

TEST(doctor, empty_root_is_not_gds) {
  gdskit::test::temp_dir dir;
  auto r = diagnose(dir.path());
  EXPECT_EQ(r.result.kind, gd::verdict_kind::unusable);
  EXPECT_EQ(r.result.first_failing_layer, "gpu");
  EXPECT_EQ(state_of(r, "gpu.driver"), gd::status::fail);
}

TEST(doctor, truncated_copies_of_every_file_do_not_crash) {
  // Cut every file of the real capture at several lengths; the doctor must survive each.
  auto src = real_capture();
  for (std::size_t cut : {0u, 1u, 7u, 33u}) {
    gdskit::test::temp_dir dir;
    for (auto& e : fs::recursive_directory_iterator(src)) {
      if (!e.is_regular_file()) continue;
      auto rel = fs::relative(e.path(), src);
      fs::create_directories((dir.path() / rel).parent_path());
      std::string text = slurp(e.path());
      std::ofstream(dir.path() / rel) << text.substr(0, std::min(cut, text.size()));
    }
    auto r = diagnose(dir.path());
    EXPECT_NE(r.result.kind, gd::verdict_kind::true_gds) << cut;
  }
}

TEST(doctor, non_root_view_with_zeroed_kallsyms_and_restricted_dmesg) {
  gdskit::test::temp_dir dir;
  fs::copy(fixture("gds-ok-nvme-ext4"), dir.path(), fs::copy_options::recursive);
  fs::remove(dir.path() / "commands/dmesg.txt");
  auto r = diagnose(dir.path());
  EXPECT_EQ(state_of(r, "logs.dmesg"), gd::status::unknown);
  EXPECT_EQ(state_of(r, "kernel.nvme_hook"), gd::status::ok);  // names are visible with zero addresses
  EXPECT_NE(find(r, "kernel.nvidia_p2p")->summary.find("addresses hidden"), std::string::npos);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::true_gds);  // dmesg is not a requirement
}

TEST(doctor, evidence_names_file_and_line) {
  auto r = diagnose(real_capture());
  auto* c = find(r, "gpu.gsp");
  ASSERT_NE(c, nullptr);
  ASSERT_FALSE(c->evidence.empty());
  EXPECT_EQ(c->evidence[0].file, "proc/driver/nvidia/params");
  EXPECT_GT(c->evidence[0].line, 0);
  EXPECT_EQ(c->evidence[0].text, "EnableGpuFirmware: 18");
}

TEST(doctor, probe_results_override_static_optimism) {
  auto root = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  gd::probe_results p;
  p.ran = true;
  auto ok = [] {
    gd::probe_step s;
    s.attempted = true;
    s.message = "ok";
    return s;
  };
  p.driver_open_default = p.handle_register = p.buf_register = p.default_write = p.default_read = ok();
  p.driver_open_strict = ok();
  p.strict_read.attempted = true;
  p.strict_read.code = 5001;
  p.strict_read.message = "CU_FILE_DRIVER_NOT_INITIALIZED";
  p.data_verified = true;
  p.cufile_stats_delta = gd::io_path_counts{};
  p.cufile_stats_delta->reads = p.cufile_stats_delta->posix_reads = 4;
  auto r = gd::diagnose(root, "/data", p);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only) << r.result.line;
  EXPECT_TRUE(r.result.proven);

  p.strict_read = ok();
  p.cufile_stats_delta->posix_reads = 0;
  p.cufile_stats_delta->nvfs_reads = 4;
  auto root2 = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  r = gd::diagnose(root2, "/data", p);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::true_gds) << r.result.line;

  p.handle_register.code = 5027;
  p.handle_register.message = "CU_FILE_HANDLE_NOT_REGISTERED";
  auto root3 = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  r = gd::diagnose(root3, "/data", p);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::unusable);
}

TEST(doctor, json_matches_golden) {
  // Set GDSKIT_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change.
  for (const std::string name : {"gds-ok-nvme-ext4", "h200-vm-no-nvfs"}) {
    auto root = name == "h200-vm-no-nvfs" ? real_capture() : fixture(name);
    auto sr = gd::system_root::captured(root);
    auto r = gd::diagnose(sr, gd::default_path(sr));
    r.root = "ROOT";  // the golden file must not depend on where the fixture lives
    std::string got = gd::render_json(r);
    fs::path golden = fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/doctor" / (name + ".json");
    if (std::getenv("GDSKIT_UPDATE_GOLDEN") != nullptr) std::ofstream(golden) << got;
    EXPECT_EQ(got, slurp(golden)) << "golden " << golden;
  }
}

TEST(doctor, capture_holds_exactly_what_was_read_and_round_trips) {
  auto src = gd::system_root::captured(fixture("p2p-einval"));
  auto before = gd::diagnose(src, "/data");
  gdskit::test::temp_dir dir;
  auto tarball = dir.path() / "cap.tar.gz";
  ASSERT_FALSE(gd::write_capture(src, "/data", tarball));
  auto out = dir.path() / "x";
  fs::create_directories(out);
  ASSERT_EQ(std::system(("tar -xzf " + tarball.string() + " -C " + out.string()).c_str()), 0);
  EXPECT_FALSE(fs::exists(out / "README.md"));  // not read by any check
  EXPECT_TRUE(fs::exists(out / "proc/modules"));
  EXPECT_TRUE(fs::exists(out / "commands/dmesg.txt"));
  std::size_t files = 0;
  for (auto& e : fs::recursive_directory_iterator(out))
    if (e.is_regular_file()) ++files;
  EXPECT_EQ(files, src.recorded().size());
  auto again = gd::system_root::captured(out);
  auto after = gd::diagnose(again, gd::default_path(again));
  EXPECT_EQ(after.result.line, before.result.line);
  EXPECT_EQ(after.result.reasons, before.result.reasons);
}

TEST(doctor, capture_on_a_full_disk_says_enospc_and_leaves_no_file) {
  auto src = gd::system_root::captured(fixture("p2p-einval"));
  (void)gd::diagnose(src, "/data");
  gdskit::test::temp_dir dir;
  const auto tarball = dir.path() / "cap.tar.gz";
  auto table = gdskit::posix::sys();
  auto real_pwrite = table.pwrite;
  // Only the archive's device is full: writes to the staging folder succeed.
  table.pwrite = [&](int fd, const void* b, std::size_t n, off_t o) -> ssize_t {
    std::error_code ec;
    auto target = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
    if (!ec && target == tarball) {
      errno = ENOSPC;
      return -1;
    }
    return real_pwrite(fd, b, n, o);
  };
  {
    gdskit::posix::scoped_syscalls faults(table);
    EXPECT_EQ(gd::write_capture(src, "/data", tarball), std::errc::no_space_on_device);
  }
  EXPECT_FALSE(fs::exists(tarball));
}

TEST(doctor, capture_archive_unpacks_and_hostile_archives_are_refused) {
  auto src = gd::system_root::captured(fixture("p2p-einval"));
  auto before = gd::diagnose(src, "/data");
  gdskit::test::temp_dir dir;
  const auto tarball = dir.path() / "cap.tar.gz";
  ASSERT_FALSE(gd::write_capture(src, "/data", tarball));
  {
    gd::private_folder out;
    std::string why;
    ASSERT_FALSE(gd::extract_capture(tarball, out.path(), why)) << why;
    auto again = gd::system_root::captured(out.path());
    EXPECT_EQ(gd::diagnose(again, gd::default_path(again)).result.line, before.result.line);
  }
  // A link out of the folder, an absolute name, a "..": refused before anything is unpacked there.
  fs::create_directories(dir.path() / "evil");
  fs::create_symlink("/etc", dir.path() / "evil/etc");
  std::ofstream(dir.path() / "evil/f") << "x";
  const std::string d = dir.path().string();
  ASSERT_EQ(std::system(("tar -czf " + d + "/link.tar.gz -C " + d + "/evil .").c_str()), 0);
  ASSERT_EQ(std::system(("tar -czPf " + d + "/abs.tar.gz " + d + "/evil/f").c_str()), 0);
  ASSERT_EQ(std::system(("cd " + d + "/evil && tar -czPf " + d + "/dotdot.tar.gz ../evil/f").c_str()), 0);
  std::ofstream(dir.path() / "junk.tar.gz") << "not an archive";
  for (const char* name : {"link.tar.gz", "abs.tar.gz", "dotdot.tar.gz", "junk.tar.gz"}) {
    gd::private_folder out;
    std::string why;
    EXPECT_TRUE(gd::extract_capture(dir.path() / name, out.path(), why)) << name;
    EXPECT_FALSE(why.empty()) << name;
    EXPECT_TRUE(fs::is_empty(out.path())) << name;
  }
}

TEST(doctor, without_a_gpu_the_report_says_so_first_in_a_few_lines) {
  gdskit::test::temp_dir dir;
  auto r = diagnose(dir.path());
  const std::string short_text = gd::render_text(r, false, /*all_layers=*/false);
  EXPECT_EQ(short_text.rfind("No usable NVIDIA GPU here", 0), 0u) << short_text;
  EXPECT_LE(std::count(short_text.begin(), short_text.end(), '\n'), 8) << short_text;
  EXPECT_NE(short_text.find("gpu.driver"), std::string::npos);
  EXPECT_NE(short_text.find("--all"), std::string::npos);
  const std::string full = gd::render_text(r, false, /*all_layers=*/true);
  EXPECT_NE(full.find("storage"), std::string::npos);
  EXPECT_GT(std::count(full.begin(), full.end(), '\n'), 15);
  // With a GPU the short form never applies.
  auto ok = diagnose(fixture("gds-ok-nvme-ext4"));
  EXPECT_EQ(gd::render_text(ok, false, false), gd::render_text(ok, false, true));
}
