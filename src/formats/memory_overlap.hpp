// Whether tensors handed to a save share memory. A safetensors file stores each tensor's bytes once, so tensors
// whose memory overlaps would be written twice and load as independent tensors; savers refuse them (as the
// safetensors library does). The rule lives here so every front end judges the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdskit::formats {

/// Where one tensor's elements lie in memory.
struct memory_layout {
  /// Tensors in different spaces never share memory (a device, or one framework storage).
  std::string space;
  /// Address of the element at index 0 in every dimension.
  std::uintptr_t address = 0;
  std::size_t itemsize = 0;
  std::vector<std::uint64_t> shape;
  /// Per dimension, the distance between neighbouring elements in bytes; negative and zero strides allowed.
  std::vector<std::int64_t> strides_bytes;
  /// true: the tensor holds exactly the bytes of its elements (strided views with holes share nothing with
  /// what lies in the holes). false: it counts as holding every byte from its lowest to its highest, the rule
  /// safetensors applies to torch storages.
  bool exact = true;
};

/// The tensors that share memory, as groups of indexes into `tensors` (each group sorted, groups ordered by
/// their first index): two tensors are in one group when they have a byte in common, directly or through
/// others of the group. Tensors with no elements share nothing. Sorted by address, only tensors whose spans
/// overlap are compared, so tensors in memory of their own cost n log n however many there are; tensors
/// with gaps (strided views) are compared byte-exactly with those whose span they overlap. Never throws
/// except std::bad_alloc.
std::vector<std::vector<std::size_t>> shared_memory_groups(const std::vector<memory_layout>& tensors);

/// Whether two layouts (of one space) have a byte in common. Exact for strided layouts: a bounded search over
/// the index equations; a pair whose search runs past the bound (1M steps, only for contrived layouts) counts
/// as sharing.
bool layouts_overlap(const memory_layout& a, const memory_layout& b);

}  // namespace gdskit::formats
