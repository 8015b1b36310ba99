// Ceilings measured in the same run as the thing they judge: raw parallel reads and writes with plain
// syscalls, pinned host->device copies, naive read + copy. Used by the benchmark programs only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>
#include <string>

namespace gdskit::bench_support {

struct rate {
  double gib_s = 0;
  unsigned threads = 0;
  double cpu_s_per_gib = 0;  ///< user + sys CPU seconds of the process per GiB moved
};

/// Creates `path` with `nbytes` of random data where nothing is there yet; uses it as it is where a regular file
/// of exactly `nbytes` is. Throws std::runtime_error, touching nothing, for anything else: a file of another size
/// (someone's data, never overwritten), a symbolic link, a FIFO, a device or a folder.
void ensure_file(const std::filesystem::path& path, std::uint64_t nbytes);
/// For a file the bench will write (and remove) itself: throws std::runtime_error where `path` holds anything but
/// nothing or a regular file of `nbytes` (what an earlier run of the same bench left).
void check_scratch(const std::filesystem::path& path, std::uint64_t nbytes);

/// What a bench program's arguments ask for.
enum class args_verdict { run, help, bad };
/// `-h` or `--help` anywhere: `usage` goes to stdout (help). An argument that starts with '-' and is not one of
/// `options` (flags the program reads itself) is refused with `usage` on stderr (bad): it would otherwise be
/// taken for a file name, or a number read as 0.
args_verdict check_args(int argc, char** argv, const char* usage, std::initializer_list<std::string_view> options = {});
/// `s` as a whole number in [lo, hi]; nullopt for anything else ("", "4x", "-1", out of range).
std::optional<unsigned long> parse_count(const char* s, unsigned long lo, unsigned long hi);
/// Drops the file from the page cache and returns the resident fraction afterwards (mincore).
double drop_cache(const std::filesystem::path& path);
/// Reads the whole file through the page cache (so it becomes resident) and returns the resident fraction.
double warm_cache(const std::filesystem::path& path);
double resident(const std::filesystem::path& path);

/// Whole file with `threads` threads, each a contiguous slice, 4 MiB preads (O_DIRECT or buffered) into
/// private buffers (not a destination buffer: pure read rate).
rate parallel_read(const std::filesystem::path& path, unsigned threads, bool direct);
/// The same reads, `request_bytes` each, but into `dst` (the whole file's size, faulted in), at the file's
/// offsets: what any reader into caller memory pays. On a RAM-backed loop device the copy into a reused 4 MiB
/// buffer stays in the CPU's last-level cache while a large destination goes to DRAM, so the two differ there.
rate parallel_read_into(const std::filesystem::path& path, unsigned threads, std::size_t request_bytes,
                        std::byte* dst);
/// Best of parallel_read over 1, 2, 4, ... max_threads (cold runs drop the cache before each try).
rate best_parallel_read(const std::filesystem::path& path, unsigned max_threads, bool direct, bool cold);
/// Whole-file O_DIRECT writes with `threads` threads (the file is rewritten with its size).
rate parallel_write_direct(const std::filesystem::path& path, std::uint64_t nbytes, unsigned threads);
rate best_parallel_write_direct(const std::filesystem::path& path, std::uint64_t nbytes, unsigned max_threads);

/// Wall time helper.
double now_s();
/// CPU seconds (user + sys) of this process so far.
double cpu_s();
/// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
double median(std::vector<double> v);

}  // namespace gdskit::bench_support
