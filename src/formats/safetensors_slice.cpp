// Tensor-parallel slice planning: which byte ranges of a tensor one rank needs.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>

#include "gdskit/error.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit::safetensors {

bool name_matches(std::string_view entry, std::string_view name) noexcept {
  if (entry.empty()) return false;
  if (entry.back() == '*') return name.starts_with(entry.substr(0, entry.size() - 1));
  if (entry.back() == '.') return name.starts_with(entry);
  return name == entry;
}

std::pair<std::uint64_t, std::uint64_t> split_rows(std::uint64_t n, unsigned rank, unsigned world) {
  if (world == 0 || rank >= world) {
    throw error(errno_code(EINVAL), "safetensors slice: " + fmt::format("slice rank {} of world {}: need 0 <= rank < world", rank, world));
  }
  const std::uint64_t base = n / world, extra = n % world;
  return {rank * base + std::min<std::uint64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

slice_plan plan_slice(const tensor_info& t, const std::optional<slice_spec>& slice) {
  slice_plan p;
  p.shape = t.shape;
  p.segment_bytes = t.nbytes();
  p.stride_bytes = t.nbytes();
  if (!slice) return p;
  (void)split_rows(0, slice->rank, slice->world);  // EINVAL for a bad rank or world, whatever the tensor
  if (slice->dim >= t.shape.size()) return p;  // replicated: biases, norms, scalars
  const unsigned bits = bits_of(t.dtype);
  const std::uint64_t n = t.shape[slice->dim];
  const auto [start, count] = split_rows(n, slice->rank, slice->world);
  p.shape[slice->dim] = count;
  // A tensor with a zero dimension has no bytes (and its other dimensions may be anything: avoid overflow).
  if (t.numel() == 0) {
    p.segment_bytes = p.stride_bytes = p.first_offset = 0;
    return p;
  }
  std::uint64_t outer = 1, inner = 1;
  for (unsigned i = 0; i < slice->dim; ++i) outer *= t.shape[i];
  for (std::size_t i = slice->dim + 1; i < t.shape.size(); ++i) inner *= t.shape[i];
  // Packed dtypes: every row boundary must fall on a byte.
  if ((inner * bits) % 8 != 0) {
    throw error(errno_code(EINVAL), "safetensors slice: " + fmt::format("tensor \"{}\" ({}) cannot be sliced along dimension {}: rows of {} elements are not whole "
                        "bytes", printable_name(t.name), to_string(t.dtype), slice->dim, inner));
  }
  const std::uint64_t row_bytes = inner * bits / 8;
  p.row_bytes = row_bytes;
  if (outer == 0 || row_bytes == 0 || count == 0) {
    p.segment_bytes = 0;
    p.segments = 1;
    p.first_offset = 0;
    p.stride_bytes = 0;
    return p;
  }
  p.segment_bytes = count * row_bytes;
  p.first_offset = start * row_bytes;
  p.stride_bytes = n * row_bytes;
  p.segments = outer;
  if (count == n || outer == 1) {  // one contiguous range
    p.segment_bytes *= outer == 1 ? 1 : outer;
    p.segments = 1;
    if (count == n) p.first_offset = 0;
  }
  return p;
}

}  // namespace gdskit::safetensors
