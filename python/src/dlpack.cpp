// gdskit.Tensor: a loaded tensor that leaves through DLPack.
#include <cerrno>

#include "bindings.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {
namespace {

// DLPack ABI (v0.8 layout of DLManagedTensor), declared here so no header is needed.
struct dl_device {
  std::int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2
  std::int32_t device_id;
};
struct dl_dtype {
  std::uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct dl_tensor {
  void* data;
  dl_device device;
  std::int32_t ndim;
  dl_dtype dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct dl_managed_tensor {
  dl_tensor dl;
  void* manager_ctx;
  void (*deleter)(dl_managed_tensor*);
};

// Owns what one exported tensor needs: the shared allocation and the shape array.
struct export_ctx {
  std::shared_ptr<void> keep_alive;
  std::vector<std::int64_t> shape;
  dl_managed_tensor managed{};
};

void delete_managed(dl_managed_tensor* m) { delete static_cast<export_ctx*>(m->manager_ctx); }

// The DLPack element type for a safetensors dtype. 8-, 6- and 4-bit floats leave as raw uint8 bytes (the
// facade reinterprets them where the consumer has such a dtype), since few consumers accept their DLPack codes.
dl_dtype dl_type_of(st::dtype t) {
  using d = st::dtype;
  switch (t) {
    case d::BOOL: return {6, 8, 1};
    case d::I8: return {0, 8, 1};
    case d::I16: return {0, 16, 1};
    case d::I32: return {0, 32, 1};
    case d::I64: return {0, 64, 1};
    case d::U16: return {1, 16, 1};
    case d::U32: return {1, 32, 1};
    case d::U64: return {1, 64, 1};
    case d::F16: return {2, 16, 1};
    case d::F32: return {2, 32, 1};
    case d::F64: return {2, 64, 1};
    case d::BF16: return {4, 16, 1};
    case d::C64: return {5, 64, 1};
    default: return {1, 8, 1};  // U8 and the packed / 8-bit float formats: raw bytes
  }
}

}  // namespace

bool raw_bytes_export(st::dtype t) {
  using d = st::dtype;
  return t == d::F8_E5M2 || t == d::F8_E4M3 || t == d::F8_E8M0 || t == d::F4 || t == d::F6_E2M3 || t == d::F6_E3M2;
}

tensor_handle tensor_handle::make(std::shared_ptr<void> keep_alive, const gdskit::buffer_view& memory, st::dtype dtype,
                                  const std::vector<std::uint64_t>& shape) {
  tensor_handle h;
  h.keep_alive = std::move(keep_alive);
  h.data = memory.data;
  h.nbytes = memory.nbytes;
  h.device = memory.kind == gdskit::memory_kind::device ? memory.device : -1;
  h.dtype = dtype;
  h.tensor_shape.assign(shape.begin(), shape.end());
  return h;
}

std::vector<std::int64_t> tensor_handle::export_shape() const {
  if (raw) return {static_cast<std::int64_t>(nbytes)};
  std::vector<std::uint64_t> s(tensor_shape.begin(), tensor_shape.end());
  return element_shape(dtype, s);
}

tensor_handle tensor_handle::raw_bytes() const {
  tensor_handle r = *this;
  r.raw = true;
  return r;
}

bool tensor_handle::aligned() const { return reinterpret_cast<std::uintptr_t>(data) % element_bytes(dtype) == 0; }

py::capsule tensor_handle::to_capsule() const {
  auto* ctx = new export_ctx{keep_alive, export_shape(), {}};
  auto& m = ctx->managed;
  m.dl.data = data;
  m.dl.device = device < 0 ? dl_device{1, 0} : dl_device{2, device};
  m.dl.ndim = static_cast<std::int32_t>(ctx->shape.size());
  m.dl.dtype = raw ? dl_dtype{1, 8, 1} : dl_type_of(dtype);
  m.dl.shape = ctx->shape.data();
  m.dl.strides = nullptr;  // compact row-major
  m.dl.byte_offset = 0;
  m.manager_ctx = ctx;
  m.deleter = delete_managed;
  // A consumer renames the capsule to "used_dltensor" and takes over the deleter; an unconsumed capsule
  // frees the tensor itself.
  PyObject* cap = PyCapsule_New(&m, "dltensor", [](PyObject* self) {
    if (PyCapsule_IsValid(self, "dltensor")) {
      auto* mt = static_cast<dl_managed_tensor*>(PyCapsule_GetPointer(self, "dltensor"));
      if (mt != nullptr && mt->deleter != nullptr) mt->deleter(mt);
    }
  });
  if (cap == nullptr) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

py::bytes tensor_handle::to_bytes() const {
  if (device >= 0) throw gdskit::error(gdskit::errno_code(EINVAL), "tobytes: tensor is in GPU memory");
  return py::bytes(static_cast<const char*>(data), nbytes);
}

namespace {

[[noreturn]] void bad_layout(const std::string& name, const std::string& what) {
  throw gdskit::error(gdskit::errno_code(EINVAL), "tensor layout", "", -1, 0,
                      "tensor \"" + st::printable_name(name) + "\": " + what);
}

}  // namespace

void register_dlpack(py::module_& m) {
  m.def(
      "tensor_layout",
      [](const py::dict& tensors, const std::vector<std::string>& names, std::uintptr_t base, std::size_t nbytes) {
        py::dict out;
        for (const auto& name : names) {
          const auto& t = tensors[py::str(name)].cast<const tensor_handle&>();
          std::uint64_t offset = 0;
          if (t.nbytes != 0) {
            const auto at = reinterpret_cast<std::uintptr_t>(t.data);
            if (at < base || at - base > nbytes || t.nbytes > nbytes - (at - base)) {
              bad_layout(name, "its bytes lie outside the allocation");
            }
            offset = at - base;
          }
          out[py::str(name)] = py::make_tuple(offset, t.nbytes, std::string(st::to_string(t.dtype)),
                                              py::tuple(py::cast(t.tensor_shape)));
        }
        return out;
      },
      py::arg("tensors"), py::arg("names"), py::arg("base"), py::arg("nbytes"),
      "{name: (offset, nbytes, dtype, shape)} of loaded tensors (a load's {name: Tensor}) that lie in one "
      "allocation of nbytes at address base: what tensors_in needs to view the same bytes anywhere. EINVAL for a "
      "tensor outside it.");
  m.def(
      "tensors_in",
      [](std::uintptr_t ptr, std::size_t nbytes, int device, py::object owner, const py::dict& layout) {
        std::shared_ptr<void> keep = std::make_shared<py_owner>(std::move(owner));
        py::dict out;
        for (auto item : layout) {
          const std::string name = item.first.cast<std::string>();
          const auto [offset, size, dtype, shape] =
              item.second.cast<std::tuple<std::uint64_t, std::uint64_t, std::string, std::vector<std::uint64_t>>>();
          const auto dt = st::parse_dtype(dtype);
          if (!dt) bad_layout(name, "unknown dtype");
          // The bytes of that dtype and shape, which the header parser and the slicer gave the tensor.
          constexpr auto most = static_cast<unsigned __int128>(1) << 70;
          unsigned __int128 bits = st::bits_of(*dt);
          for (std::uint64_t d : shape) {
            if (d != 0 && bits > most / d) bad_layout(name, "shape too large");
            bits *= d;
          }
          if (bits % 8 != 0 || bits / 8 != size) bad_layout(name, "its byte count does not match its dtype and shape");
          if (offset > nbytes || size > nbytes - offset) bad_layout(name, "its bytes lie outside the allocation");
          void* at = reinterpret_cast<std::uint8_t*>(ptr) + offset;
          const gdskit::buffer_view v = device < 0 ? gdskit::buffer_view::host(at, size)
                                                   : gdskit::buffer_view{at, size, gdskit::memory_kind::device, device};
          out[item.first] = py::cast(tensor_handle::make(keep, v, *dt, shape));
        }
        return out;
      },
      py::arg("ptr"), py::arg("nbytes"), py::arg("device"), py::arg("owner"), py::arg("layout"),
      "{name: Tensor} viewing the bytes of an allocation (ptr, nbytes on device, -1 for host memory; `owner` is "
      "kept alive by the tensors) laid out as tensor_layout gave them. EINVAL for a layout that does not fit.");

  py::class_<tensor_handle>(m, "Tensor", "A loaded tensor; exports through DLPack (__dlpack__).")
      .def("__dlpack__", [](const tensor_handle& t, py::object /*stream*/, py::kwargs) { return t.to_capsule(); },
           py::arg("stream") = py::none())
      .def("__dlpack_device__",
           [](const tensor_handle& t) -> py::tuple {
             // DLPack device types: 1 = CPU, 2 = CUDA.
             if (t.device < 0) return py::make_tuple(1, 0);
             return py::make_tuple(2, static_cast<int>(t.device));
           })
      .def("capsule", &tensor_handle::to_capsule, "A fresh 'dltensor' capsule.")
      .def("raw", &tensor_handle::raw_bytes,
           "The same memory exported as its flat bytes (uint8, shape [nbytes]): every framework imports those.")
      .def("tobytes", &tensor_handle::to_bytes, "The raw bytes (host tensors only).")
      .def_property_readonly("dtype", [](const tensor_handle& t) { return std::string(st::to_string(t.dtype)); })
      .def_property_readonly("shape", [](const tensor_handle& t) { return t.tensor_shape; })
      .def_property_readonly("nbytes", [](const tensor_handle& t) { return t.nbytes; })
      .def_property_readonly("raw_bytes", [](const tensor_handle& t) { return t.raw || raw_bytes_export(t.dtype); })
      .def_property_readonly("element_shape", &tensor_handle::export_shape,
                             "The shape exported: the framework's element shape (packed dtypes differ from shape).")
      .def_property_readonly("aligned", &tensor_handle::aligned,
                             "Whether the address is a multiple of the element size (typed views need it).")
      .def_property_readonly("device", [](const tensor_handle& t) { return t.device; })
      .def_property_readonly("data_ptr", [](const tensor_handle& t) { return reinterpret_cast<std::uintptr_t>(t.data); });
}

}  // namespace gdskit::python
