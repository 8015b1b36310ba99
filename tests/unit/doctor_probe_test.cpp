// The live probe where no GPU is: it says why it did not run; the probe-process protocol (spawn, report
// line, crash and timeout handling), the evidence parsers, and how probe results reach the verdict.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "doctor/doctor.hpp"
#include "doctor/probe.hpp"
#include "gdskit/buffer.hpp"
#include "test_support.hpp"

namespace gd = gdskit::doctor;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) { return fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/systems" / name; }

bool empty_dir(const fs::path& d) { return fs::directory_iterator(d) == fs::directory_iterator(); }

fs::path script(const gdskit::test::temp_dir& dir, const std::string& name, const std::string& body) {
  fs::path p = dir / name;
  std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

struct ran {
  int rc = -1;
  std::string out;
};
ran run_cli(const std::string& args) {
  ran r;
  FILE* p = ::popen((std::string(GDSKIT_CLI_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

gd::probe_step ok() { return {true, 0, "ok"}; }

gd::probe_results compat_host_probe() {
  gd::probe_results p;
  p.ran = true;
  p.file = "/data/.gdskit-doctor-probe";
  p.cuda_init = p.driver_open_default = p.handle_register = p.buf_register = p.default_write = p.default_read = ok();
  p.data_verified = true;
  p.driver_open_strict = {true, 5001, "CU_FILE_DRIVER_NOT_INITIALIZED: cuFile error 5001"};
  p.strict_read = {true, 5001, "strict read not reached: CU_FILE_DRIVER_NOT_INITIALIZED"};
  p.cufile_stats_delta = gd::io_path_counts{};
  p.cufile_stats_delta->reads = p.cufile_stats_delta->posix_reads = 1;
  p.cufile_stats_delta->writes = p.cufile_stats_delta->posix_writes = 1;
  p.file_device = "254:0";
  return p;
}

const gd::check* find(const gd::report& r, const std::string& id) {
  for (const auto& l : r.layers)
    for (const auto& c : l.checks)
      if (c.id == id) return &c;
  return nullptr;
}

}  // namespace

TEST(doctor_probe, without_a_gpu_the_probe_says_why_and_leaves_nothing) {
  if (gdskit::gpu_available()) GTEST_SKIP() << "a GPU is usable here: tests/gpu covers the live probe";
  gdskit::test::temp_dir dir;
  gd::probe_options o;
  o.dir = dir.path();
  auto r = gd::run_live_probe(o);
  EXPECT_FALSE(r.ran);
  EXPECT_NE(r.skipped_reason.find("no usable GPU"), std::string::npos) << r.skipped_reason;
  EXPECT_GT(r.skipped_reason.size(), std::string("no usable GPU: ").size()) << "the reason must say why";
  EXPECT_TRUE(empty_dir(dir.path()));
}

TEST(doctor_probe, probe_process_without_a_gpu_reports_cuda_init_and_creates_no_file) {
  if (gdskit::gpu_available()) GTEST_SKIP() << "a GPU is usable here";
  gdskit::test::temp_dir dir;
  auto c = gd::run_probe_child("strict", dir / "f", 1u << 20, {1, 2});
  EXPECT_EQ(c.mode, "strict");
  EXPECT_TRUE(c.cuda_init.attempted);
  EXPECT_FALSE(c.cuda_init.succeeded());
  EXPECT_FALSE(c.cuda_init.message.empty());
  EXPECT_FALSE(c.driver_open.attempted);
  EXPECT_TRUE(empty_dir(dir.path()));
}

TEST(doctor_probe, report_line_round_trips) {
  gd::child_report c;
  c.mode = "default";
  c.cuda_init = c.driver_open = c.handle_register = c.buf_register = c.write = ok();
  c.read = {true, 5027, "CU_FILE_HANDLE_NOT_REGISTERED: \"quoted\"\nnewline"};
  c.verified = true;
  c.o_direct = true;
  c.file_device = "259:1";
  c.stats = gd::io_path_counts{};
  c.stats->reads = 3;
  c.stats->nvfs_reads = 2;
  c.stats->posix_reads = 1;
  c.stats->posix_writes = 7;
  c.sweep = {{1, 1u << 20, 1.9}, {4, 1u << 20, 5.02}};
  c.notes = {"a note"};
  std::string line = gd::child_report_line(c);
  ASSERT_EQ(line.rfind(gd::kChildMarker, 0), 0u);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << "one line";
  // cuFile or the driver may print before the report: the last marker line wins.
  std::string text = "cufile noise\n" + std::string(gd::kChildMarker) + "{\"mode\":\"old\"}\n" + line;
  std::string why;
  auto p = gd::parse_child_report(text, &why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->mode, "default");
  EXPECT_EQ(p->read.code, 5027);
  EXPECT_EQ(p->read.message, c.read.message);
  EXPECT_TRUE(p->verified);
  EXPECT_TRUE(p->o_direct);
  EXPECT_EQ(p->file_device, "259:1");
  ASSERT_TRUE(p->stats);
  EXPECT_EQ(p->stats->reads, 3u);
  EXPECT_EQ(p->stats->nvfs_reads, 2u);
  EXPECT_EQ(p->stats->posix_reads, 1u);
  EXPECT_EQ(p->stats->posix_writes, 7u);
  ASSERT_EQ(p->sweep.size(), 2u);
  EXPECT_EQ(p->sweep[1].queue_depth, 4);
  EXPECT_DOUBLE_EQ(p->sweep[1].gib_per_s, 5.02);
  EXPECT_EQ(p->notes, c.notes);
}

TEST(doctor_probe, malformed_or_missing_report_lines_are_refused_with_a_reason) {
  std::string why;
  EXPECT_FALSE(gd::parse_child_report("", &why));
  EXPECT_NE(why.find("no report line"), std::string::npos);
  EXPECT_FALSE(gd::parse_child_report(std::string(gd::kChildMarker) + "{not json\n", &why));
  EXPECT_NE(why.find("malformed"), std::string::npos);
  EXPECT_FALSE(gd::parse_child_report(std::string(gd::kChildMarker) + "[1,2]\n", &why));
  EXPECT_FALSE(gd::parse_child_report("text " + std::string(gd::kChildMarker) + "{}\n", &why)) << "marker mid-line";
  // Wrong types in fields do not crash and are refused.
  EXPECT_FALSE(gd::parse_child_report(std::string(gd::kChildMarker) + "{\"mode\":3}\n", &why));
  // A missing stats object means no counters.
  auto p = gd::parse_child_report(std::string(gd::kChildMarker) + "{\"mode\":\"strict\",\"stats\":null}\n", &why);
  ASSERT_TRUE(p) << why;
  EXPECT_FALSE(p->stats);
  EXPECT_FALSE(p->read.attempted);
}

TEST(doctor_probe, the_gdskit_binary_runs_as_probe_process) {
  if (gdskit::gpu_available()) GTEST_SKIP() << "a GPU is usable here";
  gdskit::test::temp_dir dir, scratch;
  auto o = gd::spawn_probe_child(GDSKIT_CLI_PATH, "strict", dir / "f", 1u << 20, {1, 2},
                                 {"CUFILE_ALLOW_COMPAT_MODE=false"}, scratch.path(), 60);
  ASSERT_TRUE(o.report) << o.failure << " / " << o.stderr_tail;
  EXPECT_EQ(o.report->mode, "strict");
  EXPECT_FALSE(o.report->cuda_init.succeeded());
  EXPECT_TRUE(empty_dir(dir.path()));
}

TEST(doctor_probe, environment_is_passed_and_entries_can_be_removed) {
  gdskit::test::temp_dir dir;
  ::setenv("GDSKIT_PROBE_TEST_VAR", "inherited", 1);
  auto exe = script(dir, "child",
                    "printf 'GDSKIT-PROBE-CHILD {\"mode\":\"%s\",\"file_device\":\"%s\",\"notes\":[\"%s\"]}\\n' "
                    "\"$CUFILE_ALLOW_COMPAT_MODE\" \"${GDSKIT_PROBE_TEST_VAR:-unset}\" \"$2 $3\"");
  auto o = gd::spawn_probe_child(exe, "strict", dir / "f", 4096, {}, {"CUFILE_ALLOW_COMPAT_MODE=false", "GDSKIT_PROBE_TEST_VAR="},
                                 dir.path(), 30);
  ::unsetenv("GDSKIT_PROBE_TEST_VAR");
  ASSERT_TRUE(o.report) << o.failure;
  EXPECT_EQ(o.report->mode, "false");
  EXPECT_EQ(o.report->file_device, "unset");
  ASSERT_EQ(o.report->notes.size(), 1u);
  // One argument per option ("--probe-file=FILE"): a file name that starts with '-' cannot become an option.
  EXPECT_EQ(o.report->notes[0], "--probe-child=strict --probe-file=" + (dir / "f").string());
}

TEST(doctor_probe, a_crashing_or_hanging_probe_process_is_evidence_not_a_crash) {
  gdskit::test::temp_dir dir;
  auto crash = gd::spawn_probe_child(script(dir, "crash", "echo dying >&2; kill -SEGV $$"), "default", dir / "f", 4096,
                                     {}, {}, dir.path(), 30);
  EXPECT_FALSE(crash.report);
  EXPECT_NE(crash.failure.find("signal 11"), std::string::npos) << crash.failure;
  EXPECT_NE(crash.stderr_tail.find("dying"), std::string::npos);
  auto hang = gd::spawn_probe_child(script(dir, "hang", "exec sleep 30"), "default", dir / "f", 4096, {}, {}, dir.path(), 1);
  EXPECT_FALSE(hang.report);
  EXPECT_NE(hang.failure.find("did not finish"), std::string::npos) << hang.failure;
  auto silent = gd::spawn_probe_child(script(dir, "silent", "exit 3"), "default", dir / "f", 4096, {}, {}, dir.path(), 30);
  EXPECT_NE(silent.failure.find("exited with status 3"), std::string::npos) << silent.failure;
  // Dying after a complete report (library teardown at exit) keeps the report and says so.
  auto late = gd::spawn_probe_child(
      script(dir, "late", "echo 'GDSKIT-PROBE-CHILD {\"mode\":\"default\",\"verified\":true}'; kill -SEGV $$"), "default",
      dir / "f", 4096, {}, {}, dir.path(), 30);
  ASSERT_TRUE(late.report) << late.failure;
  EXPECT_TRUE(late.report->verified);
  EXPECT_TRUE(late.failure.empty());
  EXPECT_NE(late.note.find("signal 11"), std::string::npos) << late.note;
  EXPECT_NE(late.note.find("after writing its report"), std::string::npos) << late.note;
  auto missing = gd::spawn_probe_child(dir / "nope", "default", dir / "f", 4096, {}, {}, dir.path(), 30);
  EXPECT_FALSE(missing.report);
  EXPECT_FALSE(missing.failure.empty());
}

TEST(doctor_probe, nvidia_fs_stats_counters) {
  auto on = gd::parse_nvfs_stats(
      "GDS Version: 1.9.0.22\nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.20.5)\n"
      "Mmap\t\t\t: n=5 ok=5 err=0 munmap=5\nBar1-map\t\t: n=7 ok=7 err=0 free=7 callbacks=0 active=0 delay-frees=0\n"
      "Error\t\t\t: cpu-gpu-pages=0 sg-ext=0 dma-map=0 dma-ref=0\n"
      "Reads\t\t\t: n=42 ok=42 err=0 readMiB=42 io_state_err=0\nWrites\t\t\t: n=3 ok=3 err=0 writeMiB=3\n");
  ASSERT_TRUE(on.reads);
  EXPECT_EQ(*on.reads, 42u);
  ASSERT_TRUE(on.bar1_maps);
  EXPECT_EQ(*on.bar1_maps, 7u);
  auto off = gd::parse_nvfs_stats("Bar1-map\t\t: n=0 ok=0 err=0 free=0\nReads\t\t\t: err=0 io_state_err=0\n");
  EXPECT_FALSE(off.reads) << "rw_stats_enabled=0 prints no n=";
  EXPECT_TRUE(off.bar1_maps);
  auto junk = gd::parse_nvfs_stats("Reads : n=99999999999999999999999999\n\x01\x02 garbage");
  EXPECT_FALSE(junk.reads);
}

TEST(doctor_probe, new_dmesg_lines_are_the_gds_ones_that_appeared) {
  std::string before = "[1.0] nvidia-fs: old line\n[2.0] eth0 up\n";
  std::string after = before + "[3.0] NVRM: nvidia_p2p_get_pages: -22\n[3.1] usb 1-1: new device\n[3.2] nvidia-fs: old line\n";
  auto lines = gd::new_gds_dmesg_lines(before, after);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "[3.0] NVRM: nvidia_p2p_get_pages: -22");
  EXPECT_EQ(lines[1], "[3.2] nvidia-fs: old line");
  EXPECT_TRUE(gd::new_gds_dmesg_lines(after, after).empty());
}

TEST(doctor_probe, strict_configuration_turns_compat_off) {
  std::string shipped = "{\n  // \"allow_compat_mode\": true in a comment\n  \"properties\": {\n"
                        "    \"use_pci_p2pdma\": false,\n    \"allow_compat_mode\" : true,\n    \"io_batchsize\": 128\n  }\n}\n";
  std::string s = gd::strict_cufile_json(shipped);
  EXPECT_NE(s.find("\"allow_compat_mode\" : false"), std::string::npos) << s;
  EXPECT_EQ(s.find("\"allow_compat_mode\" : true"), std::string::npos) << s;
  EXPECT_NE(s.find("\"io_batchsize\": 128"), std::string::npos) << "the rest of the system config is kept";
  auto minimal = nlohmann::json::parse(gd::strict_cufile_json(""));
  EXPECT_EQ(minimal["properties"]["allow_compat_mode"], false);
  EXPECT_EQ(minimal["properties"]["use_pci_p2pdma"], false);
  auto p2p = nlohmann::json::parse(gd::strict_cufile_json("{ \"properties\": { \"use_pci_p2pdma\": true } }"));
  EXPECT_EQ(p2p["properties"]["allow_compat_mode"], false);
  EXPECT_EQ(p2p["properties"]["use_pci_p2pdma"], true) << "a P2PDMA setup keeps P2PDMA in strict mode";
}

TEST(doctor_probe, strict_5001_on_a_compat_host_is_compat_only_with_the_counters_shown) {
  auto root = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  auto r = gd::diagnose(root, "/data", compat_host_probe());
  EXPECT_EQ(r.result.kind, gd::verdict_kind::compat_only) << r.result.line;
  EXPECT_TRUE(r.result.proven);
  EXPECT_NE(r.result.line.find("5001"), std::string::npos) << r.result.line;
  auto* strict = find(r, "probe.strict_open");
  ASSERT_NE(strict, nullptr);
  EXPECT_EQ(strict->state, gd::status::fail);
  EXPECT_NE(strict->fix.find("nvidia-fs"), std::string::npos);
  auto* stats = find(r, "probe.cufile_stats");
  ASSERT_NE(stats, nullptr);
  EXPECT_EQ(stats->state, gd::status::warn);
  EXPECT_NE(stats->summary.find("posix == n"), std::string::npos) << stats->summary;
  std::string text = gd::render_text(r, false);
  EXPECT_NE(text.find("probe.strict_open"), std::string::npos);
  auto j = nlohmann::json::parse(gd::render_json(r));
  EXPECT_EQ(j["probe"]["driver_open_strict"]["code"], 5001);
  EXPECT_EQ(j["probe"]["file_device"], "254:0");
  EXPECT_EQ(j["verdict"]["exit_code"], 1);
}

TEST(doctor_probe, handle_register_5027_is_unusable_with_the_udev_fix) {
  auto p = compat_host_probe();
  p.handle_register = {true, 5027, "CU_FILE_HANDLE_NOT_REGISTERED: cuFile error 5027: file handle not registered"};
  p.default_write = {};
  p.default_read = {true, 5027, "read not reached: CU_FILE_HANDLE_NOT_REGISTERED"};
  p.data_verified = false;
  p.cufile_stats_delta.reset();
  auto root = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  auto r = gd::diagnose(root, "/data", p);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::unusable) << r.result.line;
  EXPECT_NE(r.result.line.find("5027"), std::string::npos) << r.result.line;
  auto* h = find(r, "probe.handle_register");
  ASSERT_NE(h, nullptr);
  EXPECT_NE(h->fix.find("/run/udev/data/b254:0"), std::string::npos) << h->fix;
}

TEST(doctor_probe, true_gds_needs_strict_success_direct_counters_and_verified_data) {
  auto p = compat_host_probe();
  p.driver_open_strict = p.strict_write = p.strict_read = ok();
  p.cufile_stats_delta = gd::io_path_counts{};
  p.cufile_stats_delta->reads = p.cufile_stats_delta->nvfs_reads = 1;
  auto root = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  EXPECT_EQ(gd::diagnose(root, "/data", p).result.kind, gd::verdict_kind::true_gds);
  p.data_verified = false;
  auto root2 = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  auto r = gd::diagnose(root2, "/data", p);
  EXPECT_EQ(r.result.kind, gd::verdict_kind::unusable) << r.result.line;
  EXPECT_NE(r.result.line.find("differs"), std::string::npos);
  // A probe process that crashed is unusable, with the crash named.
  auto q = compat_host_probe();
  q.driver_open_default = {true, -1, "probe process (default) killed by signal 11 (Segmentation fault)"};
  auto root3 = gd::system_root::captured(fixture("gds-ok-nvme-ext4"));
  auto r3 = gd::diagnose(root3, "/data", q);
  EXPECT_EQ(r3.result.kind, gd::verdict_kind::unusable);
  EXPECT_NE(r3.result.line.find("signal 11"), std::string::npos) << r3.result.line;
}

TEST(doctor_probe, cli_probe_on_a_machine_without_gpu_reports_the_reason) {
  if (gdskit::gpu_available()) GTEST_SKIP() << "a GPU is usable here";
  gdskit::test::temp_dir dir;
  auto r = run_cli("doctor --probe --json --path " + dir.path().string());
  ASSERT_EQ(r.rc, 1) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["probe"]["ran"], false);
  EXPECT_NE(j["probe"]["skipped_reason"].get<std::string>().find("no usable GPU"), std::string::npos);
  EXPECT_EQ(j["verdict"]["proven"], false);
  auto t = run_cli("doctor --probe --no-color --path " + dir.path().string());
  EXPECT_NE(t.out.find("live probe: not run (no usable GPU"), std::string::npos) << t.out;
  auto n = run_cli("doctor --no-probe --json --path " + dir.path().string());
  EXPECT_TRUE(nlohmann::json::parse(n.out)["probe"].is_null());
  EXPECT_TRUE(empty_dir(dir.path()));
}
