// libFuzzer target: safetensors header parsing and slice planning on untrusted bytes.
// Every input must either parse into a header whose invariants hold, or throw gdskit::error; anything else
// (a crash, a sanitizer report, another exception type, a broken invariant) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"

namespace st = gdskit::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  st::header h;
  try {
    h = st::parse_header(data, size, size, "fuzz.safetensors");
  } catch (const gdskit::error&) {
    return 0;
  }
  const std::uint64_t data_nbytes = size - h.data_offset_bytes;
  std::uint64_t prev_end = 0;
  for (const auto& t : h.tensors) {
    if (t.end_bytes > data_nbytes || t.begin_bytes > t.end_bytes) std::abort();
    if (t.nbytes() > 0) {
      if (t.begin_bytes < prev_end) std::abort();
      prev_end = t.end_bytes;
    }
    if (t.numel() * st::bits_of(t.dtype) / 8 != t.nbytes()) std::abort();
    // Slices of every dimension for a few world sizes: the planned ranges must stay inside the tensor.
    for (unsigned dim = 0; dim <= t.shape.size(); ++dim) {
      for (unsigned world : {1u, 2u, 3u, 8u}) {
        for (unsigned rank = 0; rank < world; rank += (world > 2 ? world - 1 : 1)) {
          try {
            auto p = st::plan_slice(t, st::slice_spec{rank, world, dim});
            if (p.nbytes() > 0) {
              const std::uint64_t last_end = p.first_offset + (p.segments - 1) * p.stride_bytes + p.segment_bytes;
              if (last_end > t.nbytes()) std::abort();
            }
          } catch (const gdskit::error&) {
          }
        }
      }
    }
  }
  return 0;
}
