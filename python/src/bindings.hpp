// The parts of gdskit._gdskit that several binding files share. One file per area registers its functions:
// errors.cpp (exception types and the translator), dlpack.cpp (gdskit.Tensor), files.cpp (gdskit.File's
// handle, plans), safetensors.cpp (loads, headers, shard plans), save.cpp (saves).
#pragma once

#include <pybind11/pybind11.h>
// Every file of the module sees the same type casters (a caster missing in one file is a run-time error there).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "file_object.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit::python {

namespace py = pybind11;
namespace st = gdskit::safetensors;

// The state behind gdskit.File and the memory views Python passes in (file_object.hpp, shared with the batch
// bindings).
using gdskit_python::file_object;
using gdskit_python::view_for;

/// Keeps a Python object (the caller's allocation) alive from C++; may be released on any thread.
struct py_owner {
  py::object obj;
  explicit py_owner(py::object o) : obj(std::move(o)) {}
  ~py_owner() {
    py::gil_scoped_acquire locked;
    obj = py::object();
  }
};

/// A tensor living in a model's allocation, exportable through __dlpack__ any number of times.
struct tensor_handle {
  std::shared_ptr<void> keep_alive;
  void* data = nullptr;
  std::size_t nbytes = 0;
  int device = -1;
  st::dtype dtype = st::dtype::U8;
  std::vector<std::int64_t> shape;         // as exported (raw-byte dtypes: a flat byte count for packed ones)
  std::vector<std::int64_t> tensor_shape;  // safetensors shape

  /// A fresh "dltensor" capsule that keeps the allocation alive.
  py::capsule to_capsule() const;
  /// The raw bytes; EINVAL for a tensor in GPU memory.
  py::bytes to_bytes() const;
};

/// ([{name, dtype, shape, data_offsets, file_offset}], metadata) of a parsed header.
py::tuple header_tuple(const st::header& h);

/// Whether a dtype leaves through DLPack as raw uint8 bytes (8-, 6- and 4-bit floats).
bool raw_bytes_export(st::dtype t);

void register_errors(py::module_& m);
void register_dlpack(py::module_& m);
void register_files(py::module_& m);
void register_safetensors(py::module_& m);
void register_save(py::module_& m);

}  // namespace gdskit::python
