// gdskit._gdskit: the compiled half of the Python package. Tensors leave as DLPack (legacy "dltensor"
// capsules and objects with __dlpack__), so there is no build dependency on torch or numpy.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "path_caster.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <atomic>
#include <memory>
#include <thread>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "file_object.hpp"

namespace py = pybind11;
namespace st = gdskit::safetensors;

void add_kv_bindings(py::module_& m);  // kv_bindings.cpp: gdskit.kv

namespace {

using gdskit_python::file_object;
using gdskit_python::view_for;

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

// ([{name, dtype, shape, data_offsets, file_offset}], metadata) of a parsed header.
py::tuple header_tuple(const st::header& h) {
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
}


// Keeps a Python object (the caller's allocation) alive from C++; may be released on any thread.
struct py_owner {
  py::object obj;
  explicit py_owner(py::object o) : obj(std::move(o)) {}
  ~py_owner() {
    py::gil_scoped_acquire locked;
    obj = py::object();
  }
};

// (path, reasons) for reading `f` into memory on `device` (-1: host). Without a usable GPU a device plan is
// ENODEV with the reason, as a read to that device would fail.
py::tuple plan_tuple(const gdskit::file_handle& f, int device) {
  gdskit::buffer_view v = gdskit::buffer_view::host(nullptr, 0);
  if (device >= 0) {
    std::string why;
    if (!gdskit::gpu_available(&why)) {
      throw gdskit::error(gdskit::errno_code(ENODEV), "plan", f.path().string(), -1, 0, "no usable GPU: " + why);
    }
    v = gdskit::buffer_view{nullptr, 0, gdskit::memory_kind::device, device};
  }
  auto d = f.plan(v);
  return py::make_tuple(std::string(gdskit::to_string(d.path)), d.reasons);
}

// ---- saving (the facade is gdskit/_save.py) ---------------------------------------------------------------

// OSError(errno, message, filename): Python picks the subclass (FileExistsError, ...) from the errno.
[[noreturn]] void raise_save_error(const gdskit::error& e) {
  const int code = e.code().category() == std::generic_category() ? e.code().value() : EIO;
  PyObject* args = e.path().empty() ? Py_BuildValue("(is)", code, e.what())
                                    : Py_BuildValue("(iss)", code, e.what(), e.path().c_str());
  PyErr_SetObject(PyExc_OSError, args);
  Py_XDECREF(args);
  throw py::error_already_set();
}

// One entry of the facade's list: (name, dtype, shape, address, nbytes, device, source or None).
// source(offset) -> (address, nbytes), for strided tensors staged piece by piece.
using save_entry = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::size_t, int,
                              py::object>;

std::vector<st::save_tensor> to_save_tensors(const std::vector<save_entry>& entries) {
  std::vector<st::save_tensor> out;
  out.reserve(entries.size());
  for (const auto& [name, dtype_text, shape, ptr, nbytes, device, source] : entries) {
    auto dt = st::parse_dtype(dtype_text);
    if (!dt) throw py::type_error("gdskit.save: unknown safetensors dtype \"" + dtype_text + "\"");
    st::save_tensor t{name, *dt, shape, {}, {}};
    if (source.is_none()) {
      t.data = nbytes == 0 ? gdskit::buffer_view{nullptr, 0, gdskit::memory_kind::host, -1}
                           : view_for(ptr, nbytes, device);
    } else {
      t.data = {nullptr, nbytes, device < 0 ? gdskit::memory_kind::host : gdskit::memory_kind::device, device};
      // The save copies its tensors (and so this function) on its own thread, without the GIL: the Python
      // object is shared through a pointer whose copies touch no reference count, and it is released under the
      // GIL by whichever copy goes last.
      std::shared_ptr<py::object> callable(new py::object(source), [](py::object* o) {
        py::gil_scoped_acquire locked;
        delete o;
      });
      t.source = [callable, device](std::uint64_t offset) {
        py::gil_scoped_acquire locked;
        auto r = (*callable)(offset).cast<std::pair<std::uintptr_t, std::size_t>>();
        return view_for(r.first, r.second, device);
      };
    }
    out.push_back(std::move(t));
  }
  return out;
}

py::dict save_stats_dict(const st::save_stats& s) {
  py::dict d;
  d["seconds"] = s.seconds;
  d["sync_seconds"] = s.sync_seconds;
  d["gib_per_s"] = s.gib_per_s();
  d["tensor_bytes"] = s.tensor_bytes;
  d["file_bytes"] = s.file_bytes;
  d["files"] = s.files;
  d["pieces"] = s.pieces;
  d["path"] = std::string(gdskit::to_string(s.path.path));
  d["reasons"] = s.path.reasons;
  std::vector<std::string> written;
  for (const auto& p : s.written) written.push_back(p.string());
  d["written"] = written;
  return d;
}

void add_save_functions(py::module_& m) {
  m.def(
      "save",
      [](const std::filesystem::path& path, const std::vector<save_entry>& entries,
         std::optional<st::metadata_entries> metadata, bool overwrite, bool sharded, std::uint64_t max_shard_bytes) {
        auto tensors = to_save_tensors(entries);
        st::save_options o;
        o.overwrite = overwrite;
        o.max_shard_bytes = max_shard_bytes;
        // Signal handlers run only on the main thread: it waits here and checks them, so Ctrl-C stops the save
        // between pieces (nothing is published) and raises KeyboardInterrupt.
        std::atomic<bool> stop{false}, finished{false}, interrupted{false};
        o.cancelled = [&stop] { return stop.load(); };
        st::save_stats s;
        std::exception_ptr failure;
        {
          py::gil_scoped_release unlocked;
          std::thread worker([&] {
            try {
              s = sharded ? st::save_sharded(path, tensors, metadata, o) : st::save(path, tensors, metadata, o);
            } catch (...) {
              failure = std::current_exception();
            }
            finished = true;
          });
          while (!finished) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            py::gil_scoped_acquire locked;
            if (!interrupted && PyErr_CheckSignals() != 0) interrupted = stop = true;
          }
          worker.join();
        }
        if (interrupted) throw py::error_already_set();
        if (failure) {
          try {
            std::rethrow_exception(failure);
          } catch (const gdskit::error& e) {
            if (e.code() == std::errc::invalid_argument && e.path().empty()) throw py::value_error(e.what());
            raise_save_error(e);
          }
        }
        return save_stats_dict(s);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"), py::arg("overwrite"), py::arg("sharded"),
      py::arg("max_shard_bytes"),
      "Saves [(name, dtype, shape, address, nbytes, device, source)] to a file (or a sharded folder); returns stats.");

  m.def(
      "save_layout",
      [](const std::vector<save_entry>& entries, std::optional<st::metadata_entries> metadata) {
        auto l = st::plan_save(to_save_tensors(entries), metadata);
        return py::bytes(l.header);
      },
      py::arg("tensors"), py::arg("metadata"), "The header bytes a save of these tensors writes.");
}

}  // namespace

PYBIND11_MODULE(_gdskit, m) {
  m.doc() = "gdskit: storage <-> GPU memory transfers (compiled part; use the gdskit package)";
  m.attr("__version__") = GDSKIT_VERSION_TEXT;
  gdskit_python::register_batch(m);

  // gdskit::error becomes OSError(errno, message, path): Python picks the subclass from the errno
  // (FileNotFoundError, IsADirectoryError, PermissionError, ...). A malformed file (EBADMSG) is SafetensorError,
  // which is both a ValueError (as in the safetensors library) and an OSError with that errno. CUDA and cuFile
  // codes, which are not errno values, become OSError(EIO) with the message naming the code.
  static py::handle safetensor_error;
  {
    py::tuple bases = py::make_tuple(py::handle(PyExc_OSError), py::handle(PyExc_ValueError));
    PyObject* type = PyErr_NewExceptionWithDoc("gdskit.SafetensorError",
                                               "A malformed safetensors file or index (errno EBADMSG).",
                                               bases.ptr(), nullptr);
    if (type == nullptr) throw py::error_already_set();
    safetensor_error = type;
    m.add_object("SafetensorError", py::handle(type));
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdskit::error& e) {
      const int code = e.code().category() == std::generic_category() ? e.code().value() : EIO;
      // Two statements, not ?:: newer pybind11 gives each make_tuple its own typed tuple class.
      py::object args = py::make_tuple(code, e.what());
      if (!e.path().empty()) args = py::make_tuple(code, e.what(), e.path());
      PyErr_SetObject(code == EBADMSG ? safetensor_error.ptr() : PyExc_OSError, args.ptr());
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
      [](const std::filesystem::path& path, int device, std::vector<std::string> only,
         std::optional<unsigned> rank, std::optional<unsigned> world, unsigned split_dim, py::object allocate,
         std::optional<std::size_t> coalesce_gap_bytes) {
        st::load_options o;
        o.device = device;
        if (coalesce_gap_bytes) o.coalesce_gap_bytes = *coalesce_gap_bytes;
        o.only = std::move(only);
        if (rank || world) o.slice = st::slice_spec{rank.value_or(0), world.value_or(1), split_dim};
        auto owners = std::make_shared<std::vector<std::shared_ptr<py_owner>>>();
        if (!allocate.is_none()) {
          // The caller's allocator (torch's caching allocator, say) returns (address, nbytes, owner) for at least
          // n bytes on the device; the loader checks the size and the device, and the exported tensors keep
          // every `owner` alive. st::load calls it once per shard on the thread that called st::load, which
          // released the GIL around it: each call takes the GIL back.
          o.allocate = [allocate, dev = o.device, owners](std::uint64_t n) {
            py::gil_scoped_acquire locked;
            py::tuple r = allocate(n);
            owners->push_back(std::make_shared<py_owner>(py::object(r[2])));
            return view_for(r[0].cast<std::uintptr_t>(), r[1].cast<std::size_t>(), dev);
          };
        }
        st::model model;
        const auto t0 = std::chrono::steady_clock::now();
        {
          py::gil_scoped_release unlocked;
          model = st::load(path, o);
        }
        const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::shared_ptr<void> keep = model.keep_alive();
        if (!owners->empty()) {
          using both = std::pair<std::shared_ptr<void>, std::shared_ptr<std::vector<std::shared_ptr<py_owner>>>>;
          keep = std::make_shared<both>(keep, owners);
        }
        auto owner = std::make_shared<st::model>(std::move(model));
        // The allocations live as long as any exported tensor: the model's shared storage is held by each.
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
        stats["overlapped_seconds"] = s.overlapped_seconds;
        stats["first_read_seconds"] = s.first_read_seconds;
        stats["allocations"] = s.allocations;
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
      py::arg("path"), py::arg("device") = -1, py::arg("only") = std::vector<std::string>{},
      py::arg("rank") = py::none(), py::arg("world") = py::none(), py::arg("split_dim") = 0,
      py::arg("allocate") = py::none(), py::arg("coalesce_gap_bytes") = py::none(),
      "Loads a safetensors file, index or folder onto device (-1: host, N: cuda:N): returns ({name: Tensor}, "
      "stats). allocate(nbytes) -> (address, nbytes, owner), if given, supplies the allocations: one per shard "
      "with selected tensors, called in file order on the calling thread. "
      "coalesce_gap_bytes: the largest gap between selected tensors read in one request (0: only their bytes).");

  m.def(
      "plan",
      [](const std::filesystem::path& path, int device) {
        gdskit::file_handle f(path, gdskit::open_mode::read);
        return plan_tuple(f, device);
      },
      py::arg("path"), py::arg("device") = 0, "The data path for reading this file to the device, and why.");

  m.def("header", [](const std::filesystem::path& path) {
    return header_tuple(st::read_header(path));
  }, py::arg("path"), "The validated header: ([{name, dtype, shape, data_offsets, file_offset}], metadata).");

  // ---- gdskit.File: one open file, read and written from any thread (the GIL is released during I/O). ----
  py::class_<file_object, std::shared_ptr<file_object>>(m, "FileHandle", "An open file (see gdskit.File).")
      .def(py::init([](const std::filesystem::path& path, const std::string& mode) {
             auto f = std::make_shared<file_object>();
             if (mode == "r") {
               f->handle = std::make_shared<const gdskit::file_handle>(st::open_file(path));  // cannot hang on a FIFO
             } else {
               gdskit::open_options o;
               gdskit::open_mode m = gdskit::open_mode::read_write;
               if (mode == "r+") {
               } else if (mode == "w" || mode == "w+") {
                 o.create = o.truncate = true;
                 if (mode == "w") m = gdskit::open_mode::write;
               } else if (mode == "x" || mode == "x+") {
                 o.create = o.exclusive = true;
                 if (mode == "x") m = gdskit::open_mode::write;
               } else {
                 throw py::value_error("mode must be \"r\", \"r+\", \"w\", \"w+\", \"x\" or \"x+\", not \"" + mode + "\"");
               }
               f->handle = std::make_shared<const gdskit::file_handle>(path, m, o);
             }
             return f;
           }),
           py::arg("path"), py::arg("mode") = "r")
      .def("read", &file_object::transfer<false>, py::arg("ptr"), py::arg("nbytes"), py::arg("offset"),
           py::arg("device"), "Reads up to nbytes at offset into memory at ptr (device -1: host); returns the bytes read.")
      .def("write", &file_object::transfer<true>, py::arg("ptr"), py::arg("nbytes"), py::arg("offset"),
           py::arg("device"), "Writes nbytes from memory at ptr (device -1: host) at offset; returns nbytes.")
      .def("write_gather", &file_object::write_gather, py::arg("ranges"),
           "Writes every (ptr, nbytes, offset, device) range as one transfer (memory of one kind and device, no "
           "overlaps); returns the bytes written.")
      .def("plan", [](const file_object& f, int device) { return plan_tuple(*f.get(), device); }, py::arg("device"))
      .def("size", [](const file_object& f) { return f.get()->size(); })
      .def("reserve", [](const file_object& f, std::uint64_t nbytes) {
             py::gil_scoped_release unlocked;
             return f.get()->reserve(nbytes);
           }, py::arg("nbytes"),
           "Reserves disk space for the first nbytes and makes the file at least that long (fallocate); False "
           "where the file system cannot reserve space (the size is set all the same).")
      .def("header", [](const file_object& f) { return header_tuple(st::read_header(*f.get())); },
           "The validated safetensors header of this file, as gdskit.header() gives it.")
      .def("close", [](file_object& f) { f.handle.reset(); })
      .def_property_readonly("closed", [](const file_object& f) { return !f.handle; });
  // ---- end of gdskit.File ----

  // Distributed load (gdskit/distributed.py): the files a path stands for, resolved as load() does.
  m.def("resolve_shards", [](const std::filesystem::path& path) {
    py::list out;
    for (const auto& s : st::resolve_shards(path)) out.append(py::make_tuple(s.file.string(), s.names));
    return out;
  }, py::arg("path"), "The files of a file, index or folder in load order: [(file, [names the index assigns])].");

  // Distributed save (gdskit/distributed.py): the single-process save's shard plan, file names and index.
  m.def(
      "plan_shards",
      [](const std::vector<std::uint64_t>& sizes, std::uint64_t max_shard_bytes) {
        std::vector<st::save_tensor> t(sizes.size());
        for (std::size_t i = 0; i < sizes.size(); ++i) t[i].data = {nullptr, sizes[i], gdskit::memory_kind::host, -1};
        return st::plan_shards(t, max_shard_bytes);
      },
      py::arg("sizes"), py::arg("max_shard_bytes"), "Tensor indexes per shard, as save_sharded splits them.");
  m.def("shard_file_name", &st::shard_file_name, py::arg("k"), py::arg("n"));
  m.def(
      "write_index",
      [](const std::filesystem::path& folder, const std::vector<std::pair<std::string, std::string>>& weight_map,
         std::uint64_t total_size, bool overwrite) {
        py::gil_scoped_release unlocked;
        st::write_index(folder, weight_map, total_size, overwrite);
      },
      py::arg("folder"), py::arg("weight_map"), py::arg("total_size"), py::arg("overwrite"),
      "Publishes folder/model.safetensors.index.json atomically, as save_sharded writes it.");

  m.def("gpu_available", [] {
    std::string why;
    bool ok = gdskit::gpu_available(&why);
    return py::make_tuple(ok, why);
  });

  add_save_functions(m);
  add_kv_bindings(m);
}
