// What the first GPU read of a process costs beyond the later ones: a model server reads its checkpoint once,
// in a fresh process, so one-time costs (planning the path, setting up staging lanes, the scheduler's first
// measurements) are part of its cold load. Times, in one process on one file: the device allocation, the first
// and second plan() of a GPU buffer, then `reads` cold reads of the whole file into GPU memory, and prints the
// first read against the median of the later ones, and each against a raw parallel O_DIRECT read measured in
// the same run, after the reads (best over 1..16 threads).
//
//   first_transfer_bench [FILE] [SIZE] [READS]      (defaults: ./gdskit-first.dat 3G 4)
//
// Run each measurement in a fresh process (the point is the process's first transfer); XDG_CACHE_HOME chooses
// whether a learned profile exists.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"
#include "gdskit/path.hpp"

using namespace gdskit;
using namespace gdskit::bench_support;

namespace {

constexpr const char* k_usage =
    "usage: first_transfer_bench [FILE] [SIZE] [READS >= 2]\n"
    "  What the first GPU read of a process costs beyond the later ones: READS cold reads (default 4) of FILE\n"
    "  (default gdskit-first.dat, 3G) into GPU memory, the first against the median of the others and each\n"
    "  against a raw parallel O_DIRECT read in the same run. Run it in a fresh process each time. FILE is made\n"
    "  with random data when absent; an existing file is used only when it has exactly SIZE bytes.\n";

int run(int argc, char** argv) {
  const args_verdict v = check_args(argc, argv, k_usage);
  if (v != args_verdict::run) return v == args_verdict::help ? 0 : 2;
  const std::filesystem::path path = argc > 1 ? argv[1] : "gdskit-first.dat";
  const std::uint64_t size = argc > 2 ? parse_size(argv[2]).value_or(0) : (std::uint64_t{3} << 30);
  const auto counted = argc > 3 ? parse_count(argv[3], 2, 1000) : std::optional<unsigned long>(4);
  if (size == 0 || !counted || argc > 4) {
    std::fputs(k_usage, stderr);
    return 2;
  }
  const int reads = static_cast<int>(*counted);
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("first_transfer_bench: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  ensure_file(path, size);
  const double gib = static_cast<double>(size) / (1u << 30);

  double t = now_s();
  device_buffer dst(size, 0);
  std::printf("device allocation of %s: %.3f s (not counted below)\n", format_size(size).c_str(), now_s() - t);
  file_handle f(path, open_mode::read);
  t = now_s();
  path_decision d = f.plan(dst.view());
  const double plan1 = now_s() - t;
  t = now_s();
  d = f.plan(dst.view());
  const double plan2 = now_s() - t;
  std::printf("plan() of a GPU buffer: first %.4f s, second %.4f s\npath: %s\n", plan1, plan2, d.summary().c_str());

  std::vector<double> secs;
  for (int i = 0; i < reads; ++i) {
    drop_cache(path);
    t = now_s();
    const std::size_t got = f.read(dst.view(), size, 0);
    secs.push_back(now_s() - t);
    if (got != size) {
      std::fprintf(stderr, "short read: %zu of %llu\n", got, static_cast<unsigned long long>(size));
      return 1;
    }
    std::printf("cold read %d: %.3f s = %.2f GiB/s\n", i + 1, secs.back(), gib / secs.back());
  }
  const rate raw = best_parallel_read(path, 16, /*direct=*/true, /*cold=*/true);
  const double later_median = median(std::vector<double>(secs.begin() + 1, secs.end()));
  std::printf("raw parallel O_DIRECT read (best of 1..16 threads, after the reads): %.2f GiB/s (%u threads)\n",
              raw.gib_s, raw.threads);
  std::printf("\nfirst read, first plan included: %.3f s = %.2f GiB/s = %.3f of raw\n", secs[0] + plan1,
              gib / (secs[0] + plan1), gib / (secs[0] + plan1) / raw.gib_s);
  std::printf("later reads, median:             %.3f s = %.2f GiB/s = %.3f of raw\n", later_median,
              gib / later_median, gib / later_median / raw.gib_s);
  std::printf("first read's extra time: %.3f s (%.1f%% of a later read)\n", secs[0] + plan1 - later_median,
              100.0 * (secs[0] + plan1 - later_median) / later_median);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "first_transfer_bench: %s\n", e.what());
    return 1;
  }
}
