// What each safetensors dtype is called in torch and numpy, and the shapes those frameworks see: the one table
// the package reads (loads, safe_open, saves, gdskit.load/save of bytes); and which torch dtype holds each
// numpy type (row gathers of .npy files and raw row files).
#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "bindings.hpp"
#include "gdskit/error.hpp"
#include "gdskit/gather.hpp"

namespace gdskit::python {
namespace {

struct framework_names {
  st::dtype dtype;
  const char* torch;   // torch's attribute name; nullptr: torch has no such dtype (the raw bytes stand in)
  const char* numpy;   // numpy's dtype name: the type, or for a type numpy lacks the unsigned raw bits
  bool numpy_native;   // whether `numpy` is the type itself (a save of that numpy dtype writes this dtype)
};

// 8-bit and packed floats leave as their bytes where a framework lacks the type, as safetensors does.
constexpr framework_names k_names[] = {
    {st::dtype::F64, "float64", "float64", true},
    {st::dtype::F32, "float32", "float32", true},
    {st::dtype::F16, "float16", "float16", true},
    {st::dtype::BF16, "bfloat16", "uint16", false},
    {st::dtype::C64, "complex64", "complex64", true},
    {st::dtype::I64, "int64", "int64", true},
    {st::dtype::I32, "int32", "int32", true},
    {st::dtype::I16, "int16", "int16", true},
    {st::dtype::I8, "int8", "int8", true},
    {st::dtype::U64, "uint64", "uint64", true},
    {st::dtype::U32, "uint32", "uint32", true},
    {st::dtype::U16, "uint16", "uint16", true},
    {st::dtype::U8, "uint8", "uint8", true},
    {st::dtype::BOOL, "bool", "bool", true},
    {st::dtype::F8_E4M3, "float8_e4m3fn", "uint8", false},
    {st::dtype::F8_E5M2, "float8_e5m2", "uint8", false},
    {st::dtype::F8_E8M0, "float8_e8m0fnu", "uint8", false},
    {st::dtype::F4, "float4_e2m1fn_x2", "uint8", false},
    {st::dtype::F6_E2M3, nullptr, "uint8", false},
    {st::dtype::F6_E3M2, nullptr, "uint8", false},
};

// numpy's plain numeric types that torch holds, by kind and item size: the dtype of a row gather's result.
struct npy_torch_name {
  char kind;
  std::size_t itemsize;
  const char* torch;
};
constexpr npy_torch_name k_npy_torch[] = {
    {'b', 1, "bool"},     {'u', 1, "uint8"},    {'i', 1, "int8"},      {'i', 2, "int16"},
    {'i', 4, "int32"},    {'i', 8, "int64"},    {'f', 2, "float16"},   {'f', 4, "float32"},
    {'f', 8, "float64"},  {'c', 8, "complex64"}, {'c', 16, "complex128"},
};

// torch's name for values of numpy type `t`, or nullptr: torch holds them only in this machine's (little-endian)
// byte order, which one-byte types do not have.
const char* torch_name_of(const gdskit::npy_type& t) {
  if (t.byte_order == '>' && t.itemsize > 1) return nullptr;
  for (const auto& n : k_npy_torch)
    if (n.kind == t.kind && n.itemsize == t.itemsize) return n.torch;
  return nullptr;
}

st::dtype known(const std::string& dtype) {
  const auto t = st::parse_dtype(dtype);
  if (!t) throw py::value_error("unknown safetensors dtype \"" + dtype + "\"");
  return *t;
}

}  // namespace

std::size_t element_bytes(st::dtype t) { return st::bits_of(t) >= 8 ? st::bits_of(t) / 8 : 1; }

std::vector<std::int64_t> element_shape(st::dtype t, const std::vector<std::uint64_t>& shape) {
  std::vector<std::int64_t> out(shape.begin(), shape.end());
  const unsigned bits = st::bits_of(t);
  if (bits >= 8) return out;
  std::uint64_t numel = 1;
  for (auto d : shape) numel *= d;  // the header parser checked that this does not overflow
  // F4 with an even last dimension: two values per byte along it (torch's float4_e2m1fn_x2); other packed
  // tensors: their flat bytes.
  if (t == st::dtype::F4 && !shape.empty() && shape.back() % 2 == 0) {
    out.back() /= 2;
    return out;
  }
  return {static_cast<std::int64_t>(numel * bits / 8)};
}

st::dtype dtype_from_framework(const std::string& framework, const std::string& name, const std::string& tensor) {
  for (const auto& n : k_names) {
    if (framework == "torch" ? (n.torch != nullptr && name == n.torch) : (n.numpy_native && name == n.numpy)) {
      return n.dtype;
    }
  }
  throw py::type_error(fmt::format("tensor `{}`: dtype {} has no safetensors dtype that gdskit writes", tensor, name));
}

std::vector<std::uint64_t> file_shape(st::dtype t, std::vector<std::uint64_t> shape) {
  // The inverse of element_shape for what a framework holds: torch's float4_e2m1fn_x2 counts two values per
  // element, the header counts values.
  if (t == st::dtype::F4 && !shape.empty()) shape.back() *= 2;
  return shape;
}

void register_dtypes(py::module_& m) {
  m.def(
      "dtype_table",
      [] {
        py::dict out;
        for (const auto& n : k_names) {
          py::object torch = n.torch != nullptr ? py::object(py::str(n.torch)) : py::object(py::none());
          out[py::str(std::string(st::to_string(n.dtype)))] =
              py::make_tuple(st::bits_of(n.dtype), element_bytes(n.dtype), torch, n.numpy, n.numpy_native);
        }
        return out;
      },
      "{safetensors dtype: (bits, bytes per framework element, torch name or None, numpy name, whether the numpy "
      "name is the type itself rather than its raw bits)}.");
  m.def(
      "npy_type",
      [](const std::string& descr) -> py::object {
        const auto t = gdskit::parse_npy_type(descr);
        if (!t || !t->numeric()) return py::none();
        const char* torch = torch_name_of(*t);
        return py::make_tuple(descr, t->itemsize, torch != nullptr ? py::object(py::str(torch)) : py::object(py::none()));
      },
      py::arg("descr"),
      "(descr, item size, torch's dtype name or None) for a numpy type string of a plain numeric type (bool, "
      "integers, floats, complex: '<f4', '|u1', '>i8'); None for anything else.");
  m.def(
      "npy_descr_of_torch",
      [](const std::string& name) -> py::object {
        for (const auto& n : k_npy_torch) {
          if (name == n.torch) return py::str(fmt::format("{}{}{}", n.itemsize == 1 ? '|' : '<', n.kind, n.itemsize));
        }
        return py::none();
      },
      py::arg("name"), "numpy's type string for torch's dtype `name` ('float32' -> '<f4'), or None when numpy has none.");
  m.def(
      "element_shape",
      [](const std::string& dtype, const std::vector<std::uint64_t>& shape) { return element_shape(known(dtype), shape); },
      py::arg("dtype"), py::arg("shape"),
      "The shape a framework sees for a tensor of this dtype and file shape (packed dtypes: see dtype_table).");
  m.def(
      "file_shape",
      [](const std::string& dtype, const std::vector<std::uint64_t>& shape) { return file_shape(known(dtype), shape); },
      py::arg("dtype"), py::arg("shape"), "The header's shape for a framework tensor of this dtype and shape.");
}

}  // namespace gdskit::python
