// Runs a fuzz target over every file of a corpus folder (or the files named), for builds without libFuzzer.
// With --mutate=N it then runs N inputs derived from the corpus by a small deterministic mutator (bit flips,
// interesting bytes, inserted, removed, repeated and spliced ranges), stopping early after --max-seconds=S:
// a bounded fuzzing pass that needs no clang, so CI runs it on every build. --seed=K changes the sequence.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

struct xorshift {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

// One mutation of `in` (the same kinds libFuzzer starts with), never longer than `max_len`.
std::vector<char> mutate(std::vector<char> in, const std::vector<std::vector<char>>& seeds, xorshift& rng,
                         std::size_t max_len) {
  static const char interesting[] = {'\0', '\xff', '\x7f', '\x80', '/', '.', '\n', ' ', '0', '7', '9', '[', '{', '"', 'x', 'L'};
  const int rounds = 1 + static_cast<int>(rng.below(4));
  for (int r = 0; r < rounds; ++r) {
    switch (rng.below(6)) {
      case 0:  // flip a bit
        if (!in.empty()) in[rng.below(in.size())] ^= static_cast<char>(1u << rng.below(8));
        break;
      case 1:  // an interesting byte
        if (!in.empty()) in[rng.below(in.size())] = interesting[rng.below(sizeof interesting)];
        break;
      case 2: {  // insert random bytes
        const std::size_t at = rng.below(in.size() + 1), n = 1 + rng.below(16);
        std::vector<char> add(n);
        for (auto& c : add) c = static_cast<char>(rng.next());
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), add.begin(), add.end());
        break;
      }
      case 3:  // remove a range (or cut the end)
        if (!in.empty()) {
          const std::size_t at = rng.below(in.size()), n = 1 + rng.below(in.size() - at);
          in.erase(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + n));
        }
        break;
      case 4:  // repeat a range
        if (!in.empty()) {
          const std::size_t at = rng.below(in.size()), n = 1 + rng.below(std::min<std::size_t>(in.size() - at, 512));
          std::vector<char> piece(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + n));
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), piece.begin(), piece.end());
        }
        break;
      default: {  // splice with another seed
        const auto& other = seeds[rng.below(seeds.size())];
        if (!other.empty()) {
          const std::size_t cut = rng.below(in.size() + 1), from = rng.below(other.size());
          in.resize(cut);
          in.insert(in.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        }
      }
    }
    if (in.size() > max_len) in.resize(max_len);
  }
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 0;
  std::uint64_t mutations = 0, seed = 1;
  double max_seconds = 0;
  std::vector<std::vector<char>> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--mutate=", 0) == 0) {
      mutations = std::strtoull(arg.c_str() + 9, nullptr, 10);
      continue;
    }
    if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, nullptr, 10) | 1;
      continue;
    }
    if (arg.rfind("--max-seconds=", 0) == 0) {
      max_seconds = std::strtod(arg.c_str() + 14, nullptr);
      continue;
    }
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.emplace_back(arg);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++count;
      inputs.push_back(std::move(bytes));
    }
  }
  std::printf("replayed %zu inputs\n", count);
  if (count == 0) return 1;
  if (mutations > 0) {
    // Said before the run: a crash ends the process, and the same seed repeats the same inputs.
    std::printf("mutating with --seed=%llu\n", static_cast<unsigned long long>(seed));
    std::fflush(stdout);
    xorshift rng{seed * 0x9e3779b97f4a7c15ull};
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t done = 0;
    for (; done < mutations; ++done) {
      if (max_seconds > 0 && (done & 63) == 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > max_seconds)
        break;
      const auto m = mutate(inputs[rng.below(inputs.size())], inputs, rng, 65536);
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(m.data()), m.size());
    }
    std::printf("ran %llu mutated inputs\n", static_cast<unsigned long long>(done));
  }
  return 0;
}
