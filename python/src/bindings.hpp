// The parts of gdskit._gdskit that several binding files share. One file per area registers its functions:
// errors.cpp (exception types and the translator), dlpack.cpp (gdskit.Tensor), files.cpp (gdskit.File's
// handle, plans), safetensors.cpp (loads, headers, shard plans), save.cpp (saves).
#pragma once

#include <pybind11/pybind11.h>
// Every file of the module sees the same type casters (a caster missing in one file is a run-time error there).
#include <pybind11/stl.h>
#include "path_caster.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

/// A tensor living in an allocation it keeps alive, exportable through __dlpack__ any number of times.
struct tensor_handle {
  std::shared_ptr<void> keep_alive;
  void* data = nullptr;
  std::size_t nbytes = 0;
  int device = -1;  // -1: host memory, else the CUDA device
  st::dtype dtype = st::dtype::U8;
  std::vector<std::int64_t> tensor_shape;  // the file's shape
  bool raw = false;                        // exported as its flat bytes (uint8) rather than typed

  /// A tensor of `dtype` and file shape `shape` in `memory` (host or device), which `keep_alive` owns.
  static tensor_handle make(std::shared_ptr<void> keep_alive, const gdskit::buffer_view& memory, st::dtype dtype,
                            const std::vector<std::uint64_t>& shape);
  /// The shape exported: the framework element shape (element_shape()), or [nbytes] when raw.
  std::vector<std::int64_t> export_shape() const;
  /// The same memory as flat bytes, for consumers that reinterpret them (every framework takes uint8).
  tensor_handle raw_bytes() const;
  /// Whether the data address is a multiple of the element size (typed views need it on a GPU).
  bool aligned() const;
  /// A fresh "dltensor" capsule that keeps the allocation alive.
  py::capsule to_capsule() const;
  /// The raw bytes; EINVAL for a tensor in GPU memory.
  py::bytes to_bytes() const;
};

/// Bytes per framework element of a dtype (1 for packed dtypes, whose elements are bytes).
std::size_t element_bytes(st::dtype t);
/// The shape torch and numpy see for a tensor of `t` and file shape `shape`: the shape itself, except packed
/// dtypes (F4 with an even last dimension: two values per byte along it; F6 and other F4: the flat bytes).
std::vector<std::int64_t> element_shape(st::dtype t, const std::vector<std::uint64_t>& shape);
/// The file's shape for a framework tensor of `t` (inverse of element_shape for what frameworks hold).
std::vector<std::uint64_t> file_shape(st::dtype t, std::vector<std::uint64_t> shape);
/// The safetensors dtype of a framework's dtype name ("torch": torch.<name>, "numpy": numpy's name); TypeError
/// naming `tensor` when gdskit does not write it.
st::dtype dtype_from_framework(const std::string& framework, const std::string& name, const std::string& tensor);

/// ([{name, dtype, shape, data_offsets, file_offset}], metadata) of a parsed header.
py::tuple header_tuple(const st::header& h);

/// Whether a dtype leaves through DLPack as raw uint8 bytes (8-, 6- and 4-bit floats).
bool raw_bytes_export(st::dtype t);

/// Raises the exception the module's translator makes for errno `code` (see errors.cpp) with `message` and
/// `path` (none when empty).
[[noreturn]] void raise_os_error(int code, const std::string& message, const std::string& path);
/// Raises OSError(ENODEV) for CUDA device `device` without a usable GPU, with the reason.
[[noreturn]] void raise_no_gpu(int device, const std::string& why);

/// Raises OSError(ENODEV) when CUDA device `device` (>= 0) cannot be used; -1 (host memory) passes.
void check_device(int device);

void register_errors(py::module_& m);
void register_dtypes(py::module_& m);
void register_dlpack(py::module_& m);
void register_files(py::module_& m);
void register_safetensors(py::module_& m);
void register_save(py::module_& m);
void register_slices(py::module_& m);
void register_settings(py::module_& m);
void register_checkpoint(py::module_& m);

}  // namespace gdskit::python
