// Loads a safetensors file (or a sharded checkpoint folder) into GPU memory, or host memory without a GPU, and
// prints each tensor and the data path gdskit took.
//   load_safetensors model.safetensors [cuda-device]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE|DIR [cuda-device]\n", argv[0]);
    return 2;
  }
  namespace st = gdskit::safetensors;
  st::load_options options;
  std::string why;
  options.device = gdskit::gpu_available(&why) ? (argc > 2 ? std::atoi(argv[2]) : 0) : -1;
  if (options.device < 0) std::printf("no GPU (%s): loading into host memory\n", why.c_str());
  try {
    st::model model = st::load(argv[1], options);
    for (const auto& t : model.tensors()) {
      std::string shape;
      for (auto d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
      std::printf("%-48s %-8s [%s] %zu bytes\n", t.name.c_str(), std::string(st::to_string(t.dtype)).c_str(),
                  shape.c_str(), t.data.nbytes);
    }
    const auto& s = model.stats();
    std::printf("%.2f GiB/s over %zu read(s); path: %s\n", s.gib_per_s(), s.read_requests, s.path.summary().c_str());
  } catch (const gdskit::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
