// gdskit._gdskit: the compiled half of the Python package. Tensors leave as DLPack (legacy "dltensor"
// capsules and objects with __dlpack__), so there is no build dependency on torch or numpy.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <tuple>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"

namespace py = pybind11;
namespace st = gdskit::safetensors;

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

bool raw_bytes_export(st::dtype t) {
  using d = st::dtype;
  return t == d::F8_E5M2 || t == d::F8_E4M3 || t == d::F8_E8M0 || t == d::F4 || t == d::F6_E2M3 || t == d::F6_E3M2;
}

// A tensor living in a model's allocation, exportable through __dlpack__ any number of times.
struct tensor_handle {
  std::shared_ptr<void> keep_alive;
  void* data = nullptr;
  std::size_t nbytes = 0;
  int device = -1;
  st::dtype dtype = st::dtype::U8;
  std::vector<std::int64_t> shape;      // as exported (raw-byte dtypes: a flat byte count for packed ones)
  std::vector<std::int64_t> tensor_shape;  // safetensors shape

  py::capsule to_capsule() const {
    auto* ctx = new export_ctx{keep_alive, shape, {}};
    auto& m = ctx->managed;
    m.dl.data = data;
    m.dl.device = device < 0 ? dl_device{1, 0} : dl_device{2, device};
    m.dl.ndim = static_cast<std::int32_t>(ctx->shape.size());
    m.dl.dtype = dl_type_of(dtype);
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

  py::bytes to_bytes() const {
    if (device >= 0) throw gdskit::error(gdskit::errno_code(EINVAL), "tobytes: tensor is in GPU memory");
    return py::bytes(static_cast<const char*>(data), nbytes);
  }
};

gdskit::buffer_view view_for(std::uintptr_t ptr, std::size_t nbytes, int device) {
  void* p = reinterpret_cast<void*>(ptr);
  if (device < 0) return gdskit::buffer_view::host(p, nbytes);
  return gdskit::describe_pointer(p, nbytes);
}

int parse_device(const std::string& d) {
  if (d == "cpu") return -1;
  std::string n = d;
  if (n.starts_with("cuda:")) n = n.substr(5);
  if (n == "cuda") return 0;
  try {
    std::size_t used = 0;
    int v = std::stoi(n, &used);
    if (used == n.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw gdskit::error(gdskit::errno_code(EINVAL), "device must be \"cpu\", \"cuda\" or \"cuda:N\", not \"" + d + "\"");
}

}  // namespace

PYBIND11_MODULE(_gdskit, m) {
  m.doc() = "gdskit: storage <-> GPU memory transfers (compiled part; use the gdskit package)";
  m.attr("__version__") = GDSKIT_VERSION_TEXT;

  // gdskit::error becomes OSError with the errno (FileNotFoundError for ENOENT, ...); CUDA and cuFile codes,
  // which are not errno values, become OSError(EIO) with the message naming the code.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdskit::error& e) {
      int code = e.code().category() == std::generic_category() ? e.code().value() : EIO;
      PyObject* args = Py_BuildValue("(is)", code, e.what());
      PyErr_SetObject(PyExc_OSError, args);
      Py_XDECREF(args);
    }
  });

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
      .def("tobytes", &tensor_handle::to_bytes, "The raw bytes (host tensors only).")
      .def_property_readonly("dtype", [](const tensor_handle& t) { return std::string(st::to_string(t.dtype)); })
      .def_property_readonly("shape", [](const tensor_handle& t) { return t.tensor_shape; })
      .def_property_readonly("nbytes", [](const tensor_handle& t) { return t.nbytes; })
      .def_property_readonly("raw_bytes", [](const tensor_handle& t) { return raw_bytes_export(t.dtype); })
      .def_property_readonly("device", [](const tensor_handle& t) { return t.device; })
      .def_property_readonly("data_ptr", [](const tensor_handle& t) { return reinterpret_cast<std::uintptr_t>(t.data); });

  m.def(
      "load",
      [](const std::filesystem::path& path, const std::string& device, std::vector<std::string> only,
         std::optional<unsigned> rank, std::optional<unsigned> world, unsigned split_dim, py::object allocate,
         std::optional<std::size_t> coalesce_gap_bytes) {
        st::load_options o;
        if (coalesce_gap_bytes) o.coalesce_gap_bytes = *coalesce_gap_bytes;
        o.device = parse_device(device);
        o.only = std::move(only);
        if (rank || world) o.slice = st::slice_spec{rank.value_or(0), world.value_or(1), split_dim};
        if (!allocate.is_none()) {
          // The caller's allocator (torch's caching allocator, say) returns the address of nbytes bytes on the
          // device and keeps them alive; the exported tensors then view memory the caller owns.
          o.allocate = [allocate, dev = o.device](std::uint64_t n) {
            py::gil_scoped_acquire locked;
            const auto ptr = allocate(n).cast<std::uintptr_t>();
            return view_for(ptr, static_cast<std::size_t>(n), dev);
          };
        }
        st::model model;
        const auto t0 = std::chrono::steady_clock::now();
        {
          py::gil_scoped_release unlocked;
          model = st::load(path, o);
        }
        const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        auto keep = model.keep_alive();
        auto owner = std::make_shared<st::model>(std::move(model));
        // The allocation lives as long as any exported tensor: the model's shared storage is held by each.
        py::dict tensors;
        for (const auto& t : owner->tensors()) {
          tensor_handle h;
          h.keep_alive = keep;
          h.data = t.data.data;
          h.nbytes = t.data.nbytes;
          h.device = t.data.kind == gdskit::memory_kind::device ? t.data.device : -1;
          h.dtype = t.dtype;
          for (auto d : t.shape) h.tensor_shape.push_back(static_cast<std::int64_t>(d));
          if (raw_bytes_export(t.dtype) && st::bits_of(t.dtype) != 8) {
            h.shape = {static_cast<std::int64_t>(t.data.nbytes)};
          } else {
            h.shape = h.tensor_shape;
          }
          tensors[py::str(t.name)] = py::cast(std::move(h));
        }
        const auto& s = owner->stats();
        py::dict stats;
        stats["seconds"] = s.seconds;
        stats["header_seconds"] = s.header_seconds;
        stats["alloc_seconds"] = s.alloc_seconds;
        stats["load_seconds"] = load_seconds;  // all of st::load: headers, plan, allocation, reads
        stats["gib_per_s"] = s.gib_per_s();
        stats["tensor_bytes"] = s.tensor_bytes;
        stats["bytes_read"] = s.bytes_read;
        stats["read_requests"] = s.read_requests;
        stats["files"] = s.files;
        stats["path"] = std::string(gdskit::to_string(s.path.path));
        stats["reasons"] = s.path.reasons;
        stats["metadata"] = owner->metadata();
        return py::make_tuple(tensors, stats);
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("only") = std::vector<std::string>{},
      py::arg("rank") = py::none(), py::arg("world") = py::none(), py::arg("split_dim") = 0,
      py::arg("allocate") = py::none(), py::arg("coalesce_gap_bytes") = py::none(),
      "Loads a safetensors file, index or folder: returns ({name: Tensor}, stats). allocate(nbytes) -> address, "
      "if given, supplies the one allocation (the caller keeps it alive). coalesce_gap_bytes: largest gap between "
      "selected tensors read in one request (0: only the selected bytes are read).");

  m.def(
      "read_into",
      [](const std::filesystem::path& path, std::uintptr_t ptr, std::size_t nbytes, std::uint64_t offset,
         int device) {
        gdskit::file_handle f(path, gdskit::open_mode::read);
        auto view = view_for(ptr, nbytes, device);
        py::gil_scoped_release unlocked;
        return f.read(view, nbytes, offset);
      },
      py::arg("path"), py::arg("ptr"), py::arg("nbytes"), py::arg("offset"), py::arg("device"),
      "Reads nbytes at offset of the file into memory at ptr (device -1: host). Returns the bytes read.");

  m.def(
      "plan",
      [](const std::filesystem::path& path, const std::string& device) {
        gdskit::file_handle f(path, gdskit::open_mode::read);
        int dev = parse_device(device);
        gdskit::buffer_view v = dev < 0 ? gdskit::buffer_view::host(nullptr, 0)
                                        : gdskit::buffer_view{nullptr, 0, gdskit::memory_kind::device, dev};
        auto d = f.plan(v);
        return py::make_tuple(std::string(gdskit::to_string(d.path)), d.reasons);
      },
      py::arg("path"), py::arg("device") = "cuda:0", "The data path for reading this file to the device, and why.");

  m.def("header", [](const std::filesystem::path& path) {
    auto h = st::read_header(path);
    py::list out;
    for (const auto& t : h.tensors) {
      py::dict d;
      d["name"] = t.name;
      d["dtype"] = std::string(st::to_string(t.dtype));
      d["shape"] = t.shape;
      d["data_offsets"] = py::make_tuple(t.begin_bytes, t.end_bytes);
      d["file_offset"] = t.file_offset_bytes;
      out.append(d);
    }
    return py::make_tuple(out, h.metadata);
  }, py::arg("path"), "The validated header: ([{name, dtype, shape, data_offsets, file_offset}], metadata).");

  // Distributed load (gdskit/distributed.py): the files a path stands for, resolved as load() does.
  m.def("resolve_shards", [](const std::filesystem::path& path) {
    py::list out;
    for (const auto& s : st::resolve_shards(path)) out.append(py::make_tuple(s.file.string(), s.names));
    return out;
  }, py::arg("path"), "The files of a file, index or folder in load order: [(file, [names the index assigns])].");

  // Checkpoint storage (gdskit/torch_dcp.py): many ranges of one file through one open handle.
  using range_list = std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t, int>>;
  m.def(
      "write_ranges",
      [](const std::filesystem::path& path, const range_list& ranges) {
        gdskit::file_handle f(path, gdskit::open_mode::write, gdskit::open_options{.create = true, .truncate = true});
        std::uint64_t total = 0;
        py::gil_scoped_release unlocked;
        for (const auto& [ptr, nbytes, offset, device] : ranges) {
          if (nbytes == 0) continue;
          total += f.write(view_for(ptr, nbytes, device), nbytes, offset);
        }
        return total;
      },
      py::arg("path"), py::arg("ranges"),
      "Creates (truncates) the file and writes each (ptr, nbytes, file_offset, device) range (device -1: host). "
      "Returns the bytes written.");
  m.def(
      "read_ranges",
      [](const std::filesystem::path& path, const range_list& ranges) {
        gdskit::file_handle f(path, gdskit::open_mode::read);
        std::uint64_t total = 0;
        py::gil_scoped_release unlocked;
        for (const auto& [ptr, nbytes, offset, device] : ranges) {
          if (nbytes == 0) continue;
          f.read_exact(view_for(ptr, nbytes, device), nbytes, offset);
          total += nbytes;
        }
        return total;
      },
      py::arg("path"), py::arg("ranges"),
      "Reads each (ptr, nbytes, file_offset, device) range of the file in full (a short file is an error). "
      "Returns the bytes read.");

  m.def("gpu_available", [] {
    std::string why;
    bool ok = gdskit::gpu_available(&why);
    return py::make_tuple(ok, why);
  });
}
