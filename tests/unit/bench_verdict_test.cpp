// gdskit bench: latency percentiles and the scaling verdict on synthetic curves.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/bench.hpp"

namespace gb = gdskit::bench;

TEST(BenchVerdict, GrowsAboveThePlateauIsDirect) {
  // A GeForce curve seen with true GDS: 1.9 -> 5.02 GiB/s from 1 to 4 threads, against a 3 GiB/s bounce.
  auto v = gb::judge_scaling({{1, 1.9}, {2, 3.4}, {4, 5.02}, {8, 5.1}}, 3.0);
  EXPECT_EQ(v.kind, gb::verdict_kind::direct);
  EXPECT_DOUBLE_EQ(v.peak_gib_s, 5.1);
  EXPECT_NE(v.text.find("consistent with direct DMA"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("5.10 GiB/s"), std::string::npos) << v.text;
}

TEST(BenchVerdict, FlatAtTheCopyRateIsNotDirect) {
  auto v = gb::judge_scaling({{1, 2.6}, {2, 2.9}, {4, 3.0}, {8, 3.02}, {16, 3.01}}, 3.0);
  EXPECT_EQ(v.kind, gb::verdict_kind::not_direct);
  EXPECT_NE(v.text.find("plateaus at the host copy rate"), std::string::npos) << v.text;
}

TEST(BenchVerdict, BelowThePlateauCannotTell) {
  auto v = gb::judge_scaling({{1, 0.5}, {2, 0.9}, {4, 1.2}}, 6.0);
  EXPECT_EQ(v.kind, gb::verdict_kind::inconclusive);
  EXPECT_NE(v.text.find("storage is the limit"), std::string::npos) << v.text;
}

TEST(BenchVerdict, StillGrowingNearThePlateauIsInconclusive) {
  auto v = gb::judge_scaling({{1, 1.0}, {2, 2.0}, {4, 3.2}}, 3.0);
  EXPECT_EQ(v.kind, gb::verdict_kind::inconclusive);
}

TEST(BenchVerdict, ACurveThatFallsWithDepthDoesNotGrow) {
  // cuFile compat on a virtio disk (GPU machine): best at one thread, above a slow staged plateau.
  auto v = gb::judge_scaling({{1, 1.57}, {2, 1.472}, {4, 1.132}, {8, 1.237}, {16, 1.089}}, 1.22);
  EXPECT_EQ(v.kind, gb::verdict_kind::inconclusive);
  EXPECT_NE(v.text.find("does not grow with queue depth"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("peak 1.57 at 1"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("1.09 at 16"), std::string::npos) << v.text;
}

TEST(BenchVerdict, WithoutAPlateauGrowthIsNotProof) {
  auto v = gb::judge_scaling({{4, 5.0}, {1, 1.9}, {2, 3.4}}, std::nullopt);  // unsorted input
  EXPECT_EQ(v.kind, gb::verdict_kind::inconclusive);
  EXPECT_NE(v.text.find("grows with queue depth to 5.00 GiB/s"), std::string::npos) << v.text;
  auto flat = gb::judge_scaling({{1, 3.0}, {2, 3.1}, {4, 3.05}}, std::nullopt);
  EXPECT_NE(flat.text.find("does not grow"), std::string::npos) << flat.text;
}

TEST(BenchVerdict, TooFewPoints) {
  EXPECT_EQ(gb::judge_scaling({}, 3.0).kind, gb::verdict_kind::too_few_points);
  EXPECT_EQ(gb::judge_scaling({{4, 2.0}}, 3.0).kind, gb::verdict_kind::too_few_points);
  EXPECT_EQ(gb::judge_scaling({{4, 2.0}, {4, 2.1}}, 3.0).kind, gb::verdict_kind::too_few_points);
}

TEST(BenchVerdict, SweepUsesTheStagedCurveAsPlateau) {
  auto row = [](const char* x, unsigned t, double gib) {
    gb::sweep_row r;
    r.xfer = x;
    r.io_bytes = 1 << 20;
    r.result.job.threads = t;
    r.result.bytes = static_cast<std::uint64_t>(gib * (1 << 30));
    r.result.seconds = 1.0;
    return r;
  };
  std::vector<gb::sweep_row> rows = {row("staged", 1, 2.0), row("staged", 4, 3.0), row("gds", 1, 1.9),
                                     row("gds", 2, 3.4),    row("gds", 4, 5.0)};
  std::string text = gb::sweep_verdicts(rows, std::nullopt);
  EXPECT_NE(text.find("verdict gds io 1.00 MiB: grows with queue depth"), std::string::npos) << text;
  EXPECT_NE(text.find("plateau from staged curve"), std::string::npos) << text;
  EXPECT_NE(gb::sweep_table(rows).find("staged"), std::string::npos);
}

TEST(BenchStats, Percentiles) {
  std::vector<std::uint64_t> ns;
  for (std::uint64_t i = 1000; i >= 1; --i) ns.push_back(i * 1000);  // 1..1000 us, reversed
  auto s = gb::summarize_latency(ns);
  EXPECT_DOUBLE_EQ(s.p50_us, 500.0);
  EXPECT_DOUBLE_EQ(s.p99_us, 990.0);
  EXPECT_DOUBLE_EQ(s.p999_us, 999.0);
  EXPECT_DOUBLE_EQ(s.max_us, 1000.0);
  EXPECT_DOUBLE_EQ(s.avg_us, 500.5);
  std::vector<std::uint64_t> none;
  EXPECT_DOUBLE_EQ(gb::summarize_latency(none).p99_us, 0.0);
}

TEST(BenchPattern, SeededAndPositional) {
  std::vector<std::byte> a(1000), b(1000);
  gb::fill_pattern(7, 3, a.data(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(static_cast<std::uint8_t>(a[i]), gb::pattern_byte(7, 3 + i));
  gb::fill_pattern(8, 3, b.data(), b.size());
  EXPECT_NE(a, b);
  EXPECT_FALSE(gb::check_pattern(7, 3, a.data(), a.size()));
  a[777] ^= std::byte{1};
  EXPECT_EQ(gb::check_pattern(7, 3, a.data(), a.size()), std::optional<std::size_t>(777));
}

TEST(BenchCufileStats, CountersNameThePathThatRan) {
  gb::cufile_counts c;
  EXPECT_EQ(gb::cufile_path_of(c), "none");
  EXPECT_NE(gb::describe_cufile_counts(c).find("no cuFile read or write was counted"), std::string::npos);
  c.reads = c.posix_reads = 8;
  c.writes = c.posix_writes = 2;
  EXPECT_EQ(gb::cufile_path_of(c), "compat");
  EXPECT_NE(gb::describe_cufile_counts(c).find("posix == n"), std::string::npos) << gb::describe_cufile_counts(c);
  EXPECT_NE(gb::describe_cufile_counts(c).find("reads n=8 (p2p 0, nvfs 0, posix 8)"), std::string::npos);
  c = {};
  c.reads = 6;
  c.nvfs_reads = 4;
  c.p2p_reads = 2;
  EXPECT_EQ(gb::cufile_path_of(c), "direct");
  c.posix_reads = 1;
  c.reads = 7;
  EXPECT_EQ(gb::cufile_path_of(c), "mixed");
  EXPECT_NE(gb::describe_cufile_counts(c).find("1 of 7 requests went through POSIX"), std::string::npos);
  c.shared = true;
  EXPECT_NE(gb::describe_cufile_counts(c).find("process-wide"), std::string::npos);
}

TEST(BenchCufileStats, JsonCarriesTheCountersOrNull) {
  gb::job_result r;
  EXPECT_TRUE(gb::to_json(r)["cufile_counters"].is_null());
  r.cufile_counters = gb::cufile_counts{};
  r.cufile_counters->reads = r.cufile_counters->posix_reads = 3;
  auto j = gb::to_json(r)["cufile_counters"];
  EXPECT_EQ(j["reads"], 3);
  EXPECT_EQ(j["posix_reads"], 3);
  EXPECT_EQ(j["p2p_reads"], 0);
  EXPECT_EQ(j["path"], "compat");
  EXPECT_EQ(j["shared"], false);
}
