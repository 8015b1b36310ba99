// gdskit bench: flag parsing, -x mapping, job files and the checks made before a run.
#include <gtest/gtest.h>

#include <fstream>

#include "bench/bench.hpp"
#include "bench/transfer.hpp"
#include "test_support.hpp"

namespace gb = gdskit::bench;
using args = std::vector<std::string>;

namespace {

gb::request parse(args a) { return gb::parse_args(a); }

void expect_usage_error(args a) {
  EXPECT_THROW(gb::parse_args(a), gb::usage_error) << ::testing::PrintToString(a);
}

}  // namespace

TEST(BenchOptions, EachGdsioFlag) {
  auto r = parse({"-f", "/tmp/x", "-d", "1", "-w", "8", "-s", "1G", "-i", "4K", "-o", "8K", "-I", "2", "-x", "0",
                  "-T", "3.5", "-k", "42", "-O", "1"});
  ASSERT_EQ(r.jobs.size(), 1u);
  const auto& j = r.jobs[0];
  EXPECT_EQ(j.file, "/tmp/x");
  EXPECT_EQ(j.gpu, 1);
  EXPECT_TRUE(j.gpu_given);
  EXPECT_EQ(j.threads, 8u);
  EXPECT_EQ(j.size_bytes, 1ull << 30);
  EXPECT_EQ(j.io.min_bytes, 4096u);
  EXPECT_FALSE(j.io.variable());
  EXPECT_EQ(j.offset_bytes, 8192u);
  EXPECT_EQ(j.type, gb::io_type::randread);
  EXPECT_EQ(j.xfer.kind, gb::xfer_kind::gds);
  EXPECT_EQ(j.xfer.label, "GPUD");
  EXPECT_DOUBLE_EQ(j.seconds, 3.5);
  EXPECT_EQ(j.seed, 42u);
  EXPECT_TRUE(j.no_direct);
}

TEST(BenchOptions, DirectoryVerifyAndGdskitFlags) {
  auto r = parse({"-D", "/tmp", "-s", "1M", "-V", "-I", "1", "--cold", "--json", "--quiet", "--plateau", "2.5"});
  EXPECT_EQ(r.jobs[0].directory, "/tmp");
  EXPECT_TRUE(r.jobs[0].verify);
  EXPECT_EQ(r.jobs[0].type, gb::io_type::write);
  EXPECT_TRUE(r.options.cold);
  EXPECT_TRUE(r.options.json);
  EXPECT_TRUE(r.options.quiet);
  EXPECT_DOUBLE_EQ(*r.options.plateau_gib_s, 2.5);
  EXPECT_EQ(r.jobs[0].xfer.kind, gb::xfer_kind::host) << "default transfer type is host memory";
  EXPECT_TRUE(parse({"-f", "x", "-s", "1M", "--csv"}).options.csv);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(BenchOptions, IoRangeAndLabels) {
  auto r = parse({"-f", "x", "-s", "1M", "-i", "4K:32K:1K"});
  const auto& io = r.jobs[0].io;
  EXPECT_TRUE(io.variable());
  EXPECT_EQ(io.min_bytes, 4096u);
  EXPECT_EQ(io.max_bytes, 32768u);
  EXPECT_EQ(io.step_bytes, 1024u);
  EXPECT_EQ(io.label(), "4-32-1(KiB)");
  EXPECT_EQ(parse({"-f", "x", "-s", "1M", "-i", "1M"}).jobs[0].io.label(), "1024(KiB)");
}

TEST(BenchOptions, XferMapping) {
  const std::pair<const char*, gb::xfer_kind> table[] = {
      {"0", gb::xfer_kind::gds},    {"1", gb::xfer_kind::host},  {"2", gb::xfer_kind::naive},
      {"3", gb::xfer_kind::staged}, {"4", gb::xfer_kind::naive}, {"5", gb::xfer_kind::gds},
      {"6", gb::xfer_kind::batch},  {"7", gb::xfer_kind::batch}, {"gds", gb::xfer_kind::gds},
      {"staged", gb::xfer_kind::staged}, {"compat", gb::xfer_kind::compat}, {"host", gb::xfer_kind::host},
      {"naive", gb::xfer_kind::naive}, {"batch", gb::xfer_kind::batch}, {"batch-stream", gb::xfer_kind::batch},
      {"host-batch", gb::xfer_kind::host_batch}};
  for (auto [text, kind] : table) {
    auto x = gb::parse_xfer(text);
    ASSERT_TRUE(x) << text;
    EXPECT_EQ(x->kind, kind) << text;
  }
  EXPECT_TRUE(gb::parse_xfer("4")->page_cache);
  // gdsio 7 and batch-stream order each batch on a CUDA stream; 6 does not.
  EXPECT_TRUE(gb::parse_xfer("7")->stream);
  EXPECT_TRUE(gb::parse_xfer("batch-stream")->stream);
  EXPECT_FALSE(gb::parse_xfer("6")->stream);
  EXPECT_EQ(gb::parse_xfer("6")->label, "GPU_BATCH");
  EXPECT_FALSE(gb::needs_gpu(gb::xfer_kind::host_batch));
  EXPECT_TRUE(gb::needs_gpu(gb::xfer_kind::batch));
  EXPECT_EQ(gb::parse_xfer("1")->label, "CPUONLY");
  EXPECT_FALSE(gb::parse_xfer("8"));
  EXPECT_FALSE(gb::parse_xfer("GPUD"));
}

TEST(BenchOptions, IoTypeNamesAndNumbers) {
  EXPECT_EQ(parse({"-f", "x", "-s", "1M", "-I", "3"}).jobs[0].type, gb::io_type::randwrite);
  EXPECT_EQ(parse({"-f", "x", "-s", "1M", "-I", "write"}).jobs[0].type, gb::io_type::write);
}

TEST(BenchOptions, EachErrorIsAUsageError) {
  expect_usage_error({"-s", "1M"});                                   // no -f or -D
  expect_usage_error({"-f", "x"});                                    // no -s
  expect_usage_error({"-f", "x", "-D", "/tmp", "-s", "1M"});          // both
  expect_usage_error({"-f", "x", "-s", "1M", "-i", "0"});             // io size 0
  expect_usage_error({"-f", "x", "-s", "1M", "-i", "8K:4K:1K"});      // max < min
  expect_usage_error({"-f", "x", "-s", "1M", "-i", "4K:8K:0"});       // step 0
  expect_usage_error({"-f", "x", "-s", "1M", "-i", "4K:8K"});         // not min:max:step
  expect_usage_error({"-f", "x", "-s", "lots"});                      // bad size
  expect_usage_error({"-f", "x", "-s", "0"});                         // size 0
  expect_usage_error({"-f", "x", "-s", "1M", "-w", "0"});             // threads 0
  expect_usage_error({"-f", "x", "-s", "1M", "-w", "two"});
  expect_usage_error({"-f", "x", "-s", "1M", "-I", "4"});
  expect_usage_error({"-f", "x", "-s", "1M", "-x", "9"});
  expect_usage_error({"-f", "x", "-s", "1M", "-x", "fast"});
  expect_usage_error({"-f", "x", "-s", "1M", "-d", "-1"});
  expect_usage_error({"-f", "x", "-s", "1M", "-T", "-2"});
  expect_usage_error({"-f", "x", "-s", "1M", "-T", "nan"});
  expect_usage_error({"-f", "x", "-s", "1M", "-T", "inf"});
  expect_usage_error({"-f", "x", "-s", "1M", "--plateau", "nan"});
  expect_usage_error({"-f", "x", "-s", "1M", "-k", "seed"});
  expect_usage_error({"-f", "x", "-s", "1M", "-O", "2"});
  expect_usage_error({"-f", "x", "-s", "1M", "-V", "-T", "1"});       // like gdsio
  expect_usage_error({"-f", "x", "-s", "1M", "-Z", "1"});             // unknown flag
  expect_usage_error({"-f", "x", "-s", "1M", "--fast"});
  expect_usage_error({"-f", "x", "-s", "1M", "-w"});                  // missing value
  expect_usage_error({"-f", "x", "-s", "1M", "--plot", "a.svg", "--sweep", "threads=1,2"});
  expect_usage_error({"-f", "x", "-s", "1M", "--plot", "a.png"});     // plot without sweep
  expect_usage_error({"-f", "x", "-s", "1M", "--json", "--csv"});
  expect_usage_error({"-f", "x", "-s", "1M", "--warm", "--cold"});
  expect_usage_error({"-f", "x", "-s", "1M", "-I", "1", "--warm"});  // nothing to warm for a write
  expect_usage_error({"-f", "x", "-s", "1M", "--plateau", "0"});
  expect_usage_error({"-f", "x", "-s", "1M", "--sweep", "io=1M"});
  expect_usage_error({"-f", "x", "-s", "1M", "--sweep", "threads=1,zero"});
  expect_usage_error({"-f", "x", "-s", "1M", "--sweep", "depth=1"});
  expect_usage_error({"/nonexistent/jobfile.gdsio"});
}

// The parser's own errors (a flag given twice, a flag without its value) come in gdskit's words, as from the CLI.
TEST(BenchOptions, ParserErrorsNameTheFlag) {
  auto message = [](args a) -> std::string {
    try {
      (void)gb::parse_args(a);
    } catch (const gb::usage_error& e) {
      return e.what();
    }
    return "no usage_error";
  };
  EXPECT_EQ(message({"-f", "x", "-s", "4G", "-s", "5G"}), "-s given twice (4G, 5G); it takes one value");
  EXPECT_EQ(message({"-f", "x", "-s", "1M", "--sweep", "threads=1", "--sweep", "threads=2"}),
            "--sweep given twice (threads=1, threads=2); it takes one value");
  EXPECT_EQ(message({"-f", "x", "-s", "1M", "-w"}), "-w needs a value: THREADS");
}

TEST(BenchOptions, Sweep) {
  auto s = gb::parse_sweep("threads=1,2,4,8,16,io=1M,4M,x=host,naive");
  EXPECT_EQ(s.threads, (std::vector<unsigned>{1, 2, 4, 8, 16}));
  EXPECT_EQ(s.io_bytes, (std::vector<std::uint64_t>{1 << 20, 4 << 20}));
  ASSERT_EQ(s.xfers.size(), 2u);
  EXPECT_EQ(s.xfers[1].kind, gb::xfer_kind::naive);
}

TEST(BenchOptions, ConfigFileJobs) {
  const char* text = R"(# two jobs
[global]
name=mix
xfer_type=1
rw=randread
bs=64K
size=1M
random_seed=7
runtime=0

[job1]
filename=/tmp/a
num_threads=2
gpu_dev_id=0
numa_node=0

[job2]
directory=/tmp
num_threads=3
rw=write
bs=4K:16K:4K
do_verify=1
)";
  gb::job_spec defaults;
  auto jobs = gb::parse_config(text, defaults);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].name, "job1");
  EXPECT_EQ(jobs[0].file, "/tmp/a");
  EXPECT_EQ(jobs[0].threads, 2u);
  EXPECT_EQ(jobs[0].type, gb::io_type::randread);
  EXPECT_EQ(jobs[0].io.min_bytes, 65536u);
  EXPECT_EQ(jobs[0].seed, 7u);
  EXPECT_EQ(jobs[0].xfer.kind, gb::xfer_kind::host);
  EXPECT_EQ(jobs[1].directory, "/tmp");
  EXPECT_EQ(jobs[1].type, gb::io_type::write);
  EXPECT_TRUE(jobs[1].io.variable());
  EXPECT_TRUE(jobs[1].verify);
  EXPECT_THROW(gb::parse_config("[global]\nsize=1M\n", defaults), gb::usage_error);
  EXPECT_THROW(gb::parse_config("[job1]\nspeed=9\n", defaults), gb::usage_error);
  EXPECT_THROW(gb::parse_config("size=1M\n[job1]\n", defaults), gb::usage_error);
  EXPECT_THROW(gb::parse_config("[job1\n", defaults), gb::usage_error);
  EXPECT_THROW(gb::parse_config("[job1]\nbs\n", defaults), gb::usage_error);
  // A NUL would cut the file name short at open(2): refused, naming the line.
  try {
    gb::parse_config(std::string("[job1]\nsize=4K\nfilename=/tmp/a\0b\n", 33), defaults);
    ADD_FAILURE() << "a NUL in a job file was accepted";
  } catch (const gb::usage_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("line 3:", 0), 0u) << e.what();
  }
  EXPECT_THROW(gb::parse_config("[job1]\nruntime=nan\n", defaults), gb::usage_error);
}

TEST(BenchValidate, BadInputBeforeAnythingRuns) {
  gdskit::test::temp_dir dir;
  auto job = [&](args a) { return gb::parse_args(a).jobs.at(0); };
  // Missing file for reads.
  EXPECT_THROW(gb::validate(job({"-f", (dir / "missing").string(), "-s", "1M"})), gb::usage_error);
  // Size larger than the file.
  gdskit::test::write_file(dir / "small", gdskit::test::random_bytes(4096, 1));
  EXPECT_THROW(gb::validate(job({"-f", (dir / "small").string(), "-s", "1M", "-i", "4K"})), gb::usage_error);
  // Two workers need twice the size.
  gdskit::test::write_file(dir / "one", gdskit::test::random_bytes(8192, 1));
  EXPECT_NO_THROW(gb::validate(job({"-f", (dir / "one").string(), "-s", "8K", "-i", "4K"})));
  EXPECT_THROW(gb::validate(job({"-f", (dir / "one").string(), "-s", "8K", "-i", "4K", "-w", "2"})), gb::usage_error);
  // io size above the size per worker.
  EXPECT_THROW(gb::validate(job({"-f", (dir / "one").string(), "-s", "4K", "-i", "8K"})), gb::usage_error);
  // Writes into a folder that does not exist, or is not writable.
  EXPECT_THROW(gb::validate(job({"-f", (dir / "no/such/f").string(), "-s", "4K", "-i", "4K", "-I", "1"})),
               gb::usage_error);
  if (::geteuid() != 0) {
    std::filesystem::create_directory(dir / "ro");
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    EXPECT_THROW(gb::validate(job({"-f", (dir / "ro/f").string(), "-s", "4K", "-i", "4K", "-I", "1"})),
                 gb::usage_error);
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_all);
  }
  // GPU types: without a usable GPU the reason is given; with one, an index out of range is refused.
  std::string why;
  if (!gb::gpu_usable(&why)) {
    try {
      gb::validate(job({"-f", (dir / "one").string(), "-s", "8K", "-i", "4K", "-x", "naive"}));
      ADD_FAILURE() << "expected a usage error";
    } catch (const gb::usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("needs a GPU"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(gb::validate(job({"-f", (dir / "one").string(), "-s", "8K", "-i", "4K", "-x", "naive", "-d", "1023"})),
                 gb::usage_error);
  }
  if (std::filesystem::exists(dir / "ro")) EXPECT_TRUE(std::filesystem::is_empty(dir / "ro"));
}

TEST(BenchOptions, RangesPastTheLargestFileOffsetAreRefused) {
  // Each of these wrapped around 2^64 (or passed off_t) and slipped through the size checks.
  expect_usage_error({"-f", "x", "-s", "9223372036854775808", "-w", "2"});         // -s above 2^63 - 1
  expect_usage_error({"-f", "x", "-s", "4611686018427387904", "-w", "2"});         // 2^62 x 2 = 2^63
  expect_usage_error({"-f", "x", "-s", "4096", "-i", "4096", "-o", "18446744073709551615"});
  expect_usage_error({"-f", "x", "-s", "4096", "-i", "4096", "-o", "9223372036854771712", "-I", "1"});
  expect_usage_error({"-D", "/tmp", "-s", "4611686018427387904", "-w", "2", "-i", "4K"});  // total bytes
  gb::job_spec j;
  j.file = "x";
  j.size_bytes = std::uint64_t{1} << 62;
  j.threads = 4;
  EXPECT_THROW(gb::check_extent(j), gb::usage_error);
  j.threads = 1;
  j.offset_bytes = std::uint64_t{1} << 62;
  EXPECT_THROW(gb::check_extent(j), gb::usage_error);  // 2^62 + 2^62 = 2^63
  j.offset_bytes = (std::uint64_t{1} << 62) - 1;
  EXPECT_EQ(gb::check_extent(j), (std::uint64_t{1} << 63) - 1);
}

TEST(BenchOptions, GdsioFlagsAndJobKeysAcceptTheSameSet) {
  // Each gdsio flag next to its job-file key: both accepted with the same effect, or both refused.
  struct pair {
    args flag;
    std::string key;
    bool accepted;
  };
  const std::vector<pair> pairs = {
      {{"-n", "0"}, "numa_node=0", true},       {{"-m", "0"}, "mem_type=0", true},
      {{"-m", "1"}, "mem_type=1", false},       {{"-m", "3"}, "mem_type=3", false},
      {{"-b"}, "skip_bufregister=1", true},     {{"-R"}, "fill_random=1", true},
      {{"-F"}, "refill_buffer=1", true},        {{"-p"}, "enable_nvlinks=1", false},
      {{"-U"}, "unaligned=1", false},           {{"-a", "4K"}, "alignment_size=4K", false},
      {{"-B", "8"}, "batch_size=8", true},      {{"-O", "1"}, "fd_mode=1", true},
      {{"-B", "0"}, "batch_size=0", false},     {{"-B", "65537"}, "batch_size=65537", false},
  };
  gb::job_spec defaults;
  for (const auto& p : pairs) {
    args a = {"-f", "x", "-s", "1M"};
    a.insert(a.end(), p.flag.begin(), p.flag.end());
    const std::string text = "[job1]\nfilename=x\nsize=1M\n" + p.key + "\n";
    if (p.accepted) {
      gb::job_spec from_flag, from_key;
      EXPECT_NO_THROW(from_flag = gb::parse_args(a).jobs.at(0)) << p.key;
      EXPECT_NO_THROW(from_key = gb::parse_config(text, defaults).at(0)) << p.key;
      EXPECT_EQ(from_flag.numa_node, from_key.numa_node) << p.key;
      EXPECT_EQ(from_flag.refill, from_key.refill) << p.key;
      EXPECT_EQ(from_flag.no_direct, from_key.no_direct) << p.key;
      EXPECT_EQ(from_flag.batch, from_key.batch) << p.key;
    } else {
      EXPECT_THROW(gb::parse_args(a), gb::usage_error) << p.key;
      EXPECT_THROW(gb::parse_config(text, defaults), gb::usage_error) << p.key;
    }
  }
  EXPECT_EQ(gb::parse_args({"-f", "x", "-s", "1M", "-n", "0"}).jobs[0].numa_node, 0);
  EXPECT_TRUE(gb::parse_args({"-f", "x", "-s", "1M", "-F"}).jobs[0].refill);
  expect_usage_error({"-f", "x", "-s", "1M", "-M", "50"});  // mixed read/write: two jobs instead
  // -B is the batch size of the batch types: the default when absent, refused for the others before any I/O.
  EXPECT_EQ(gb::batch_ranges(parse({"-f", "x", "-s", "1M", "-x", "host-batch"}).jobs[0]), gb::k_default_batch);
  EXPECT_EQ(gb::batch_ranges(parse({"-f", "x", "-s", "1M", "-x", "6", "-B", "128"}).jobs[0]), 128u);
  EXPECT_EQ(gb::batch_ranges(parse({"-f", "x", "-s", "1M", "-x", "host"}).jobs[0]), 1u);
  {
    gdskit::test::temp_dir dir;
    gdskit::test::write_file(dir / "f", gdskit::test::random_bytes(1 << 20, 2));
    const std::string f = (dir / "f").string();
    try {
      gb::validate(parse({"-f", f, "-s", "64K", "-i", "4K", "-x", "host", "-B", "8"}).jobs[0]);
      ADD_FAILURE() << "-B with -x host was accepted";
    } catch (const gb::usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("only the batch types"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(gb::validate(parse({"-f", f, "-s", "64K", "-i", "4K", "-x", "host-batch", "-B", "8"}).jobs[0]));
    // Each worker holds -B slots of the io size: more than 16 GiB is refused with the product named.
    EXPECT_THROW(gb::validate(parse({"-f", f, "-s", "1M", "-i", "1M", "-x", "host-batch", "-B", "20000"}).jobs[0]),
                 gb::usage_error);
  }
  expect_usage_error({"-f", "x", "-s", "1M", "-P", "rdma://h"});
  EXPECT_NO_THROW(parse({"-f", "x", "-s", "1M", "-J"}));
  // A NUMA node that does not exist is refused before anything runs; one that does binds the workers.
  if (!gb::numa_node_cpus(0).empty()) {
    gdskit::test::temp_dir dir;
    gdskit::test::write_file(dir / "f", gdskit::test::random_bytes(8192, 1));
    EXPECT_NO_THROW(gb::validate(gb::parse_args({"-f", (dir / "f").string(), "-s", "4K", "-i", "4K", "-n", "0"}).jobs[0]));
  }
  EXPECT_THROW(gb::validate(gb::parse_args({"-f", "x", "-s", "1M", "-n", "1023"}).jobs[0]), gb::usage_error);
}

TEST(BenchOptions, ProgressFlags) {
  EXPECT_FALSE(parse({"-f", "x", "-s", "1M"}).options.progress.has_value());
  EXPECT_TRUE(*parse({"-f", "x", "-s", "1M", "--progress"}).options.progress);
  EXPECT_FALSE(*parse({"-f", "x", "-s", "1M", "--no-progress"}).options.progress);
  EXPECT_FALSE(*parse({"-f", "x", "-s", "1M", "--quiet"}).options.progress);
  expect_usage_error({"-f", "x", "-s", "1M", "--progress", "--no-progress"});
}
