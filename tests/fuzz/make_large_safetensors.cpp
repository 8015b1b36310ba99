// Writes the large-header corpus of the safetensors fuzz target into a folder: inputs far above libFuzzer's
// 64 KiB cap (up to a million tensors, huge metadata, long names), valid and broken, so the replay
// test keeps header parsing linear and correct at the sizes real checkpoints and hostile files reach.
// Generated at test time rather than committed: together they are tens of MiB.
//   make_large_safetensors <folder> [tensors]     (default 200000; the largest file has 5x as many)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

// 8-byte little-endian length, the JSON padded with spaces to 8 bytes, then `data_nbytes` bytes.
void write_file(const std::filesystem::path& p, std::string json, std::uint64_t data_nbytes) {
  json.append((8 - json.size() % 8) % 8, ' ');
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out << json;
  const std::string zeros(1 << 16, '\0');
  for (std::uint64_t left = data_nbytes; left > 0;) {
    const std::uint64_t k = left < zeros.size() ? left : zeros.size();
    out.write(zeros.data(), static_cast<std::streamsize>(k));
    left -= k;
  }
  if (!out) {
    std::fprintf(stderr, "make_large_safetensors: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

std::string entry(const std::string& name, std::uint64_t begin, std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string((end - begin) / 4) +
         "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// n four-byte tensors. reversed: names count down while offsets count up. tail: appended as the last entry.
std::string tensors(std::size_t n, bool reversed, const std::string& tail = {}) {
  std::string json = "{";
  json.reserve(n * 72);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) json += ',';
    json += entry("model.layers." + std::to_string(reversed ? n - 1 - i : i) + ".weight", 4 * i, 4 * i + 4);
  }
  if (!tail.empty()) json += "," + tail;
  return json + "}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: make_large_safetensors <folder> [tensors]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const std::size_t n = argc == 3 ? std::stoul(argv[2]) : 200000;
  write_file(dir / "tensors.safetensors", tensors(n, false), 4 * n);
  write_file(dir / "tensors-reversed-names.safetensors", tensors(n, true), 4 * n);
  write_file(dir / "tensors-5x.safetensors", tensors(5 * n, false), 20 * n);
  write_file(dir / "duplicate-at-end.safetensors", tensors(n, false, entry("model.layers.0.weight", 4 * n, 4 * n + 4)),
             4 * n + 4);
  write_file(dir / "overlap-at-end.safetensors", tensors(n, false, entry("last", 4 * n - 2, 4 * n + 2)), 4 * n + 4);
  write_file(dir / "past-end-at-end.safetensors", tensors(n, false, entry("last", 4 * n, 4 * n + 4)), 4 * n);
  std::string meta = "{\"__metadata__\":{";
  for (std::size_t i = 0; i < n; ++i) meta += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":\"v\"";
  write_file(dir / "metadata-keys.safetensors", meta + "}}", 0);
  write_file(dir / "name-4mib.safetensors", "{" + entry(std::string(4 << 20, 'n'), 0, 4) + "}", 4);
  std::printf("wrote the large safetensors corpus to %s\n", dir.c_str());
  return 0;
}
