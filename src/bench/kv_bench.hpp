// `gdskit bench kv`: the KV-cache block store under the loads an inference engine puts on it (put storm, cold
// get, a 70/30 get/put mix with Zipf reuse, churn at full capacity), killed with SIGKILL and reopened, and run
// through faults (ENOSPC, EIO, a slow device) injected at the syscall seam, each against the device's raw
// rate measured in the same run and against the peers' design (one file per block, written to a temporary
// name and renamed, read back with plain reads). Every hit is checked byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gdskit/kv.hpp"

namespace CLI {
class App;
}

namespace gdskit::bench {

/// The phases of a run, in the order they run.
inline const std::vector<std::string>& kv_all_mixes() {
  static const std::vector<std::string> m = {"put", "get", "mix", "churn", "crash", "faults", "baseline"};
  return m;
}

struct kv_options {
  std::vector<std::filesystem::path> dirs;     ///< --dir (repeatable): store folders (one per device)
  std::vector<std::uint64_t> block_bytes = {std::uint64_t{64} << 10, std::uint64_t{2} << 20, std::uint64_t{8} << 20};
  std::uint64_t capacity_bytes = std::uint64_t{1} << 30;  ///< --capacity, all dirs together
  std::vector<std::string> mixes = kv_all_mixes();        ///< --mix
  double seconds = 3;                  ///< --seconds per timed phase
  unsigned threads = 4;                ///< --threads: callers
  unsigned in_flight = 2;              ///< --in-flight: calls each caller keeps in flight
  unsigned batch = 0;                  ///< --batch keys per call; 0: 8 MiB worth (1..64)
  double zipf = 0.99;                  ///< --zipf exponent of the mix
  double get_fraction = 0.7;           ///< --get-fraction of the mix's calls
  unsigned kills = 3;                  ///< --kills for the crash phase
  int gpu = -1;                        ///< --gpu N: blocks in GPU memory of device N (-1: host memory)
  kv::durability mode = kv::durability::cache;
  bool json = false;
  bool keep = false;                   ///< --keep: leave the store and baseline files
  std::uint64_t seed = 1;
  // The crash phase's writer (a hidden flag: the bench starts itself as the process it kills).
  std::filesystem::path crash_child_progress;
};

/// Registers the flags of `gdskit bench kv` on `cmd`. After parsing, the returned function makes the options
/// (throws usage_error for bad values).
std::function<kv_options()> add_kv_flags(CLI::App& cmd);

/// Runs the benchmark and reports (a table, or --json). Returns the exit code: 0 when every check held (no
/// wrong bytes, no hangs, capacity kept), 1 when one did not, 2 for bad input (nothing ran), 3 for a failure
/// during the run.
int run_kv(const std::function<kv_options()>& make_options, std::ostream& out, std::ostream& err);

/// Zipf-distributed ranks 0..n-1 (rank 0 the most frequent) with exponent `s`, drawn from a precomputed CDF.
class zipf_ranks {
 public:
  zipf_ranks(std::size_t n, double s);
  /// The rank for a uniform `u` in [0, 1).
  std::size_t operator()(double u) const;

 private:
  std::vector<double> cdf_;
};

/// Fills `dst` (n bytes, n a multiple of 8) with the bench's block for key id `id`: a fixed pseudo-random
/// pattern with the id and the page number stamped at the start of every 4 KiB page.
void kv_fill_block(std::uint64_t id, std::uint8_t* dst, std::size_t n);
/// Whether `data` is exactly the block of `id`.
bool kv_check_block(std::uint64_t id, const std::uint8_t* data, std::size_t n);

}  // namespace gdskit::bench
