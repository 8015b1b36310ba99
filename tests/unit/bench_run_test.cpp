// gdskit bench end to end on host memory: runs, verification, a planted corruption, job files, JSON keys.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include <cstring>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "gdskit/error.hpp"
#include "test_support.hpp"
#include "tools/programs.hpp"

namespace gb = gdskit::bench;
namespace fs = std::filesystem;

namespace {

struct outcome {
  int rc;
  std::string out, err;
};

outcome run(std::vector<std::string> a, const gb::hooks& h = {}) {
  std::ostringstream out, err;
  a.push_back("--quiet");
  int rc = gb::run_command(a, out, err, h);
  return {rc, out.str(), err.str()};
}

// Every key path of a JSON value, "a.b.c"; array elements are described by their first element as "a[]".
void key_paths(const nlohmann::json& j, const std::string& prefix, std::set<std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string p = prefix.empty() ? it.key() : prefix + "." + it.key();
      out.insert(p);
      key_paths(it.value(), p, out);
    }
  } else if (j.is_array() && !j.empty() && j.front().is_object()) {
    key_paths(j.front(), prefix + "[]", out);
  }
}

}  // namespace

TEST(BenchRun, WriteThenVerifiedReadOnHostMemory) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "data").string();
  auto w = run({"-f", f, "-s", "1M", "-i", "64K", "-w", "4", "-I", "1", "-V", "-k", "5"});
  ASSERT_EQ(w.rc, 0) << w.err;
  EXPECT_EQ(w.out.rfind("IoType: WRITE XferType: CPUONLY Threads: 4 DataSetSize: 4096/4096(KiB) IOSize: 64(KiB)", 0), 0u)
      << w.out;
  EXPECT_NE(w.out.find("created:     " + f), std::string::npos) << w.out;
  EXPECT_NE(w.out.find("verify:      OK, 4194304 bytes"), std::string::npos) << w.out;
  EXPECT_EQ(fs::file_size(f), 4u << 20);
  // Every byte on disk is the seeded pattern.
  auto bytes = gdskit::test::read_file(f);
  EXPECT_FALSE(gb::check_pattern(5, 0, reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));

  auto r = run({"-f", f, "-s", "1M", "-i", "64K", "-w", "4", "-I", "0", "-V", "-k", "5", "--cold"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("IoType: READ XferType: CPUONLY Threads: 4"), std::string::npos);
  EXPECT_NE(r.out.find("path:        host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--cold:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("created:"), std::string::npos);
  // --warm reads the data set through the page cache first: the run starts fully resident.
  auto warm = run({"-f", f, "-s", "1M", "-i", "64K", "-w", "4", "-I", "0", "-k", "5", "--warm", "--cold", "--json"});
  EXPECT_EQ(warm.rc, 2);
  warm = run({"-f", f, "-s", "1M", "-i", "64K", "-w", "4", "-I", "0", "-k", "5", "--warm", "--json"});
  ASSERT_EQ(warm.rc, 0) << warm.err;
  auto wj = nlohmann::json::parse(warm.out)["results"][0]["page_cache"];
  EXPECT_TRUE(wj["warm"].get<bool>());
  // (At least 95%: tests running beside this one may make the kernel reclaim a few pages before the run starts.)
  EXPECT_GE(wj["before"].get<double>(), 0.95) << warm.out;
  // A different seed is caught.
  auto bad = run({"-f", f, "-s", "1M", "-i", "64K", "-w", "4", "-I", "0", "-V", "-k", "6"});
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("verification failed"), std::string::npos);
}

TEST(BenchRun, RandomAndVariableSizesReplayWithTheSameSeed) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "rnd").string();
  auto w = run({"-f", f, "-s", "512K", "-i", "4K:32K:4K", "-w", "2", "-I", "3", "-V", "-k", "9", "-o", "4K"});
  ASSERT_EQ(w.rc, 0) << w.err;
  EXPECT_NE(w.out.find("IoType: RANDWRITE"), std::string::npos);
  EXPECT_NE(w.out.find("IOSize: 4-32-4(KiB)"), std::string::npos);
  // The file may have holes; extend it so the read-side size check passes.
  if (fs::file_size(f) < 4096 + 2 * 512 * 1024) fs::resize_file(f, 4096 + 2 * 512 * 1024);
  auto r = run({"-f", f, "-s", "512K", "-i", "4K:32K:4K", "-w", "2", "-I", "2", "-V", "-k", "9", "-o", "4K"});
  EXPECT_EQ(r.rc, 0) << r.err << r.out;
}

TEST(BenchRun, PlantedCorruptionIsCaught) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "c").string();
  gb::hooks h;
  h.after_write = [](const gb::job_spec&, const std::vector<fs::path>& files) {
    int fd = ::open(files.front().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, 300001), 1);
    b ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &b, 1, 300001), 1);
    ::fdatasync(fd);
    ::close(fd);
    gb::drop_page_cache(files.front());
  };
  auto w = run({"-f", f, "-s", "1M", "-i", "128K", "-w", "2", "-I", "1", "-V"}, h);
  EXPECT_EQ(w.rc, 1);
  EXPECT_NE(w.out.find("verify:      FAILED: mismatch in " + f + " at offset 300001"), std::string::npos) << w.out;
}

TEST(BenchRun, DirectoryModeAndTimedRun) {
  gdskit::test::temp_dir dir;
  auto w = run({"-D", dir.path().string(), "-s", "256K", "-i", "64K", "-w", "3", "-I", "1"});
  ASSERT_EQ(w.rc, 0) << w.err;
  for (int n = 0; n < 3; ++n) EXPECT_EQ(fs::file_size(dir / ("gdsio." + std::to_string(n))), 256u * 1024);
  auto t = run({"-D", dir.path().string(), "-s", "256K", "-i", "64K", "-w", "3", "-I", "2", "-T", "0.3"});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("IoType: RANDREAD"), std::string::npos);
}

TEST(BenchRun, BadInputWritesNothing) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "missing").string();
  auto r = run({"-f", f, "-s", "1M"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("no such file to read"), std::string::npos) << r.err;
  auto g = run({"-f", (dir / "new").string(), "-s", "1M", "-I", "1", "-x", "gds"});
  EXPECT_EQ(g.rc, 2);
  EXPECT_NE(g.err.find("-x gds"), std::string::npos) << g.err;
  auto d = run({"-f", (dir / "new").string(), "-s", "1M", "-I", "1", "-x", "0", "-d", "99"});
  EXPECT_EQ(d.rc, 2);
  EXPECT_EQ(run({"-f", (dir / "new").string(), "-s", "1M", "-i", "0", "-I", "1"}).rc, 2);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(BenchRun, JobFileRunsJobsConcurrentlyWithATotal) {
  gdskit::test::temp_dir dir;
  std::ofstream(dir / "jobs.gdsio") << "[global]\nxfer_type=1\nrw=write\nbs=64K\nsize=512K\ndo_verify=1\n"
                                    << "[job1]\nfilename=" << (dir / "a").string() << "\nnum_threads=2\n"
                                    << "[job2]\ndirectory=" << dir.path().string() << "\nnum_threads=2\n";
  auto r = run({(dir / "jobs.gdsio").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("job job1:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job job2:"), std::string::npos);
  EXPECT_NE(r.out.find("total of 2 concurrent jobs:\nIoType: WRITE XferType: CPUONLY Threads: 4 DataSetSize: 2048/2048(KiB)"),
            std::string::npos)
      << r.out;
  auto j = run({(dir / "jobs.gdsio").string(), "--json"});
  ASSERT_EQ(j.rc, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["results"].size(), 2u);
  EXPECT_EQ(doc["total"]["threads"], 4);
}

TEST(BenchRun, JsonKeysMatchTheGolden) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "j").string();
  auto r = run({"-f", f, "-s", "256K", "-i", "64K", "-I", "1", "-V", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::set<std::string> keys;
  key_paths(nlohmann::json::parse(r.out), "", keys);
  std::ifstream golden(fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/bench/result_keys.txt");
  ASSERT_TRUE(golden) << "missing tests/fixtures/bench/result_keys.txt";
  std::set<std::string> expect;
  for (std::string line; std::getline(golden, line);)
    if (!line.empty() && line[0] != '#') expect.insert(line);
  std::string actual;
  for (const auto& k : keys) actual += k + "\n";
  EXPECT_EQ(keys, expect) << "keys now:\n" << actual;
}

TEST(BenchRun, CsvAndSweepOnHost) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "s").string();
  ASSERT_EQ(run({"-f", f, "-s", "256K", "-i", "64K", "-w", "4", "-I", "1"}).rc, 0);
  auto c = run({"-f", f, "-s", "256K", "-i", "64K", "-w", "2", "--csv"});
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(c.out.rfind(gb::csv_header(), 0), 0u);
  auto s = run({"-f", f, "-s", "256K", "-i", "64K", "--sweep", "threads=1,2,4"});
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_NE(s.out.find("verdict host io 64.00 KiB: host memory"), std::string::npos) << s.out;
  // A sweep point that does not fit the file is refused before anything runs.
  EXPECT_EQ(run({"-f", f, "-s", "256K", "-i", "64K", "--sweep", "threads=1,8"}).rc, 2);
  // --plot into a missing folder, or without gnuplot in the system folders: refused before the sweep, not
  // after it.
  auto nofolder = run({"-f", f, "-s", "256K", "-i", "64K", "--sweep", "threads=1,2", "--plot", (dir / "no/x.png").string()});
  EXPECT_EQ(nofolder.rc, 2);
  EXPECT_NE(nofolder.err.find("does not exist"), std::string::npos) << nofolder.err;
  std::optional<gdskit::tools::program_dirs_for_testing> no_programs;
  no_programs.emplace(std::vector<std::string>{dir.path().string()});
  auto nognuplot = run({"-f", f, "-s", "256K", "-i", "64K", "--sweep", "threads=1,2", "--plot", (dir / "x.png").string()});
  no_programs.reset();
  EXPECT_EQ(nognuplot.rc, 2);
  EXPECT_NE(nognuplot.err.find("gnuplot is not in " + dir.path().string()), std::string::npos) << nognuplot.err;
  EXPECT_EQ(nognuplot.out.find("verdict"), std::string::npos) << "the sweep ran before the refusal";
}

TEST(BenchRun, SweepPlotIsAPng) {
  gdskit::test::temp_dir dir;
  const auto png = dir / "sweep.png";
  if (std::string why = gb::plot_precheck(png); !why.empty()) GTEST_SKIP() << why;
  const std::string f = (dir / "s").string();
  ASSERT_EQ(run({"-f", f, "-s", "256K", "-i", "64K", "-w", "2", "-I", "1"}).rc, 0);
  auto s = run({"-f", f, "-s", "256K", "-i", "64K", "--sweep", "threads=1,2", "--plot", png.string()});
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_NE(s.out.find("chart: " + png.string()), std::string::npos) << s.out;
  auto bytes = gdskit::test::read_file(png);
  ASSERT_GE(bytes.size(), 8u);
  const unsigned char magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(0, std::memcmp(bytes.data(), magic, 8));
}

TEST(BenchRun, AWorkerThreadThatCannotStartIsAnErrorAndTheOthersAreJoined) {
  gdskit::test::temp_dir dir;
  const std::string f = (dir / "data").string();
  gb::hooks h;
  // The fourth of eight threads fails to start, as std::thread does under RLIMIT_NPROC.
  h.before_thread = [](std::size_t index) {
    if (index == 3) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  };
  auto r = run({"-f", f, "-s", "64K", "-i", "4K", "-w", "8", "-I", "1"}, h);
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("worker thread 4 of 8"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(f)) << "the file the failed run created is removed";

  gb::job_spec j;
  j.file = f;
  j.size_bytes = 64 << 10;
  j.io = {4096, 4096, 0};
  j.threads = 8;
  j.type = gb::io_type::write;
  try {
    gb::run_jobs({j}, {}, h);
    ADD_FAILURE() << "expected gdskit::error";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code(), std::errc::resource_unavailable_try_again);
  }
}
