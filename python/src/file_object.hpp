// What the binding files share: the state behind gdskit.File and the memory views Python passes in.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"

namespace gdskit_python {

namespace py = pybind11;

/// A view of `nbytes` at `ptr`: host memory for device -1, else whatever the CUDA driver says the pointer is.
inline gdskit::buffer_view view_for(std::uintptr_t ptr, std::size_t nbytes, int device) {
  void* p = reinterpret_cast<void*>(ptr);
  if (device < 0) return gdskit::buffer_view::host(p, nbytes);
  return gdskit::describe_pointer(p, nbytes);
}

// The state behind gdskit.File; shared with the calls in flight, so closing waits for nothing and frees nothing
// that a read still uses.
struct file_object {
  std::shared_ptr<const gdskit::file_handle> handle;
  // A call holds its own reference while the GIL is released, so close() on another thread cannot free the
  // handle under it; the file closes when the last call in flight ends.
  std::shared_ptr<const gdskit::file_handle> get() const {
    if (!handle) throw py::value_error("I/O operation on a closed gdskit.File");
    return handle;
  }
  // read (Write false) or write of nbytes at ptr on `device` (-1: host), with the GIL released.
  template <bool Write>
  std::size_t transfer(std::uintptr_t ptr, std::size_t nbytes, std::uint64_t offset, int device) const {
    const auto h = get();
    py::gil_scoped_release unlocked;
    const auto view = view_for(ptr, nbytes, device);
    return Write ? h->write(view, nbytes, offset) : h->read(view, nbytes, offset);
  }
  // One gathered write of [(ptr, nbytes, offset, device)], with the GIL released.
  std::size_t write_gather(const std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t, int>>& ranges) const {
    const auto h = get();
    py::gil_scoped_release unlocked;
    std::vector<gdskit::write_extent> extents;
    extents.reserve(ranges.size());
    for (const auto& [ptr, nbytes, offset, device] : ranges) extents.push_back({view_for(ptr, nbytes, device), offset});
    return h->write_gather(extents);
  }
};

/// Registers the batch API (gdskit._gdskit.submit_batch, Batch, gather_rows, read_npy_header).
void register_batch(py::module_& m);

}  // namespace gdskit_python
