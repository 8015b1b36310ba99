// gdskit._gdskit's half of gdskit.kv: the block store and its futures. Keys are converted here (bytes or int,
// checked); rows arrive as (address, device) pairs that the facade (gdskit/kv/__init__.py) took from tensors
// and arrays it checked. Every call releases the GIL while the store works. The store's errors go through the
// module's one translator (errors.cpp): EINVAL is gdskit.InvalidArgumentError (a ValueError and an OSError),
// as from a load or a save.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "path_caster.hpp"

#include <cerrno>
#include <chrono>
#include <optional>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/kv.hpp"

namespace py = pybind11;
namespace kv = gdskit::kv;

namespace {

// One key: bytes (1..32 of them) or an integer (bool excluded; numpy integers accepted through __index__).
kv::key key_of(py::handle h, std::size_t i) {
  if (PyBytes_Check(h.ptr()) || PyByteArray_Check(h.ptr())) {
    const std::string b = PyBytes_Check(h.ptr()) ? std::string(py::reinterpret_borrow<py::bytes>(h))
                                                 : std::string(PyByteArray_AsString(h.ptr()),
                                                               static_cast<std::size_t>(PyByteArray_Size(h.ptr())));
    if (b.empty() || b.size() > 32) {
      throw py::value_error("key " + std::to_string(i) + " is " + std::to_string(b.size()) +
                            " bytes; a byte key holds 1 to 32 (a block hash)");
    }
    return kv::key::from_bytes(b);
  }
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr())) {
    throw py::type_error("key " + std::to_string(i) + " must be bytes or int, not " +
                         std::string(Py_TYPE(h.ptr())->tp_name));
  }
  py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
  if (!v) throw py::error_already_set();
  int overflow = 0;
  const long long small = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow == 0) {
    if (small == -1 && PyErr_Occurred()) throw py::error_already_set();
    return kv::key::from_int(small);
  }
  const bool negative = overflow < 0;
  py::object magnitude = negative ? py::reinterpret_steal<py::object>(PyNumber_Negative(v.ptr())) : py::object(v);
  py::bytes le;
  try {
    le = magnitude.attr("to_bytes")(32, "little");
  } catch (const py::error_already_set&) {
    throw py::value_error("key " + std::to_string(i) + ": an int key must be below 2**256 in magnitude");
  }
  const std::string b = le;
  return kv::key::from_magnitude(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()),
                                 negative);
}

std::vector<kv::key> keys_of(const py::handle& keys) {
  if (PyBytes_Check(keys.ptr()) || PyUnicode_Check(keys.ptr()) || PyLong_Check(keys.ptr())) {
    throw py::type_error("keys must be a list of keys (bytes or int), not a single " +
                         std::string(Py_TYPE(keys.ptr())->tp_name));
  }
  std::vector<kv::key> out;
  std::size_t i = 0;
  for (py::handle k : keys) out.push_back(key_of(k, i++));
  return out;
}

// Views of `n` rows of block_bytes at the given addresses, on `device` (-1: host).
std::vector<gdskit::buffer_view> rows_of(const std::vector<std::uintptr_t>& ptrs, std::size_t block_bytes, int device) {
  std::vector<gdskit::buffer_view> out;
  out.reserve(ptrs.size());
  for (std::uintptr_t p : ptrs) {
    void* data = reinterpret_cast<void*>(p);
    out.push_back(device < 0 ? gdskit::buffer_view::host(data, block_bytes)
                             : gdskit::buffer_view{data, block_bytes, gdskit::memory_kind::device, device});
  }
  return out;
}

// An operation's deadline `deadline_s` seconds from now (the store's default when None).
kv::op_options options_of(std::optional<double> deadline_s) {
  kv::op_options oo;
  if (deadline_s) {
    if (!(*deadline_s >= 0) || *deadline_s > 1e6) throw py::value_error("deadline_s must be a number of seconds >= 0");
    oo.deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(*deadline_s));
  }
  return oo;
}

py::tuple outcome(const kv::op_result& r) {
  py::list ok, errors;
  for (std::size_t i = 0; i < r.ok.size(); ++i) {
    ok.append(py::bool_(r.ok[i]));
    const std::error_code& e = r.errors[i];
    errors.append(e ? (e.category() == std::generic_category() ? e.value() : EIO) : 0);
  }
  return py::make_tuple(ok, errors);
}

// A submitted operation and the Python objects whose memory it uses: they are let go only after it ended.
struct future_object {
  std::unique_ptr<kv::op_future> future;
  py::object keep;
  ~future_object() {
    if (future) {
      // Waits until the operation ended (by its deadline at the latest), without the GIL unless the
      // interpreter is shutting down (its thread states may be gone then).
#if PY_VERSION_HEX >= 0x030D0000
      const bool finalizing = Py_IsFinalizing() != 0;
#else
      const bool finalizing = _Py_IsFinalizing() != 0;
#endif
      if (finalizing) {
        future.reset();
      } else {
        py::gil_scoped_release unlocked;
        future.reset();
      }
    }
    keep = py::object();
  }
  const kv::op_future& get() const { return *future; }
};

// The store, with a lock so that close() never runs under a call in flight on another thread.
struct store_object {
  kv::block_store store;
  mutable std::shared_mutex mutex;

  // Errors leave as gdskit::error, which the module's one translator (errors.cpp) turns into the Python
  // exception every other binding raises for the same errno.
  template <class F>
  auto call(F&& f) const {
    py::gil_scoped_release unlocked;
    std::shared_lock lock(mutex);
    if (!store.is_open()) throw gdskit::error(gdskit::errno_code(EBADF), "block store: the store is closed");
    return f(const_cast<kv::block_store&>(store));
  }
};

py::dict stats_dict(const kv::store_stats& s) {
  py::dict d;
  d["capacity_bytes"] = s.capacity_bytes;
  d["block_bytes"] = s.block_bytes;
  d["slot_bytes"] = s.slot_bytes;
  d["slots"] = s.slots;
  d["blocks"] = s.blocks;
  d["pinned"] = s.pinned;
  d["physical_bytes"] = s.physical_bytes;
  d["puts"] = s.puts;
  d["stored"] = s.stored;
  d["already_present"] = s.already_present;
  d["put_failures"] = s.put_failures;
  d["not_admitted"] = s.not_admitted;
  d["gets"] = s.gets;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["checksum_failures"] = s.checksum_failures;
  d["timeouts"] = s.timeouts;
  d["cancelled"] = s.cancelled;
  d["io_errors"] = s.io_errors;
  d["no_space"] = s.no_space;
  d["evictions"] = s.evictions;
  d["checkpoints"] = s.checkpoints;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  d["quarantined"] = s.quarantined;
  d["durability"] = std::string(kv::to_string(s.mode));
  d["path"] = std::string(gdskit::to_string(s.path));
  d["path_reasons"] = s.path_reasons;
  d["direct"] = s.direct;
  d["direct_reason"] = s.direct_reason;
  py::dict r;
  r["seconds"] = s.recovery.seconds;
  r["created"] = s.recovery.created;
  r["from_checkpoint"] = s.recovery.from_checkpoint;
  r["clean"] = s.recovery.clean;
  r["blocks"] = s.recovery.blocks;
  r["headers_read"] = s.recovery.headers_read;
  r["bad_headers"] = s.recovery.bad_headers;
  r["bytes_read"] = s.recovery.bytes_read;
  d["recovery"] = r;
  return d;
}

}  // namespace

void add_kv_bindings(py::module_& m) {
  m.def("kv_capacity_for", [](std::uint64_t blocks, std::size_t block_bytes, std::size_t paths) {
          return kv::capacity_for(blocks, block_bytes, paths);
        }, py::arg("blocks"), py::arg("block_bytes"), py::arg("paths") = 1,
        "The capacity_bytes a block store needs for `blocks` blocks of block_bytes over `paths` paths.");
  py::class_<future_object, std::shared_ptr<future_object>>(m, "KVFuture", "A submitted block store operation.")
      .def("done", [](const future_object& f) { return f.get().ready(); })
      .def("wait", [](const future_object& f, std::optional<double> timeout) {
             py::gil_scoped_release unlocked;
             if (!timeout) {
               f.get().wait();
               return true;
             }
             return f.get().wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::duration<double>(std::max(0.0, *timeout))));
           }, py::arg("timeout") = py::none(), "Waits until done or the timeout (seconds); returns done().")
      .def("outcome", [](const future_object& f) {
             const kv::op_result* r = nullptr;
             {
               py::gil_scoped_release unlocked;
               r = &f.get().get();
             }
             return outcome(*r);
           }, "Waits, then ([ok per key], [errno per key, 0 when ok]).")
      .def("cancel", [](const future_object& f) { return f.get().cancel(); })
      .def("fileno", [](const future_object& f) { return f.get().fd(); });

  py::class_<store_object, std::shared_ptr<store_object>>(m, "KVStore", "A KV-cache block store (see gdskit.kv).")
      .def(py::init([](const std::vector<std::filesystem::path>& paths, std::uint64_t capacity_bytes,
                       std::size_t block_bytes, const std::string& name_space, const std::string& durability,
                       double deadline_s, const std::string& admission, bool preallocate) {
             kv::store_options o;
             o.paths = paths;
             o.capacity_bytes = capacity_bytes;
             o.block_bytes = block_bytes;
             o.name_space = name_space;
             if (durability == "cache") {
               o.mode = kv::durability::cache;
             } else if (durability == "persist") {
               o.mode = kv::durability::persist;
             } else {
               throw py::value_error("durability must be \"cache\" or \"persist\", not \"" + durability + "\"");
             }
             if (admission == "always") {
               o.admit = kv::admission::always;
             } else if (admission == "second_hit") {
               o.admit = kv::admission::second_hit;
             } else {
               throw py::value_error("admission must be \"always\" or \"second_hit\", not \"" + admission + "\"");
             }
             if (!(deadline_s > 0) || deadline_s > 1e6) {
               throw py::value_error("deadline_s must be a positive number of seconds, not " + std::to_string(deadline_s));
             }
             o.deadline = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(deadline_s));
             o.preallocate = preallocate;
             auto s = std::make_shared<store_object>();
             {
               py::gil_scoped_release unlocked;
               s->store = kv::block_store(o);
             }
             return s;
           }),
           py::arg("paths"), py::arg("capacity_bytes"), py::arg("block_bytes"), py::arg("namespace"),
           py::arg("durability"), py::arg("deadline_s"), py::arg("admission"), py::arg("preallocate"))
      .def("put", [](const store_object& s, const py::object& keys, const std::vector<std::uintptr_t>& ptrs, int device,
                     std::optional<double> deadline_s) {
             auto k = keys_of(keys);
             const kv::op_options oo = options_of(deadline_s);
             return outcome(s.call([&](kv::block_store& st) {
               return st.put(k, rows_of(ptrs, st.options().block_bytes, device), oo);
             }));
           }, py::arg("keys"), py::arg("ptrs"), py::arg("device"), py::arg("deadline_s") = py::none())
      .def("get", [](const store_object& s, const py::object& keys, const std::vector<std::uintptr_t>& ptrs, int device,
                     std::optional<double> deadline_s) {
             auto k = keys_of(keys);
             const kv::op_options oo = options_of(deadline_s);
             return outcome(s.call([&](kv::block_store& st) {
               return st.get(k, rows_of(ptrs, st.options().block_bytes, device), oo);
             }));
           }, py::arg("keys"), py::arg("ptrs"), py::arg("device"), py::arg("deadline_s") = py::none())
      .def("submit", [](const store_object& s, bool reads, const py::object& keys, const std::vector<std::uintptr_t>& ptrs,
                        int device, py::object keep, std::optional<double> deadline_s, std::uintptr_t stream) {
             auto k = keys_of(keys);
             kv::op_options oo = options_of(deadline_s);
             oo.stream = reinterpret_cast<void*>(stream);
             auto f = std::make_shared<future_object>();
             f->keep = std::move(keep);
             f->future = std::make_unique<kv::op_future>(s.call([&](kv::block_store& st) {
               const auto rows = rows_of(ptrs, st.options().block_bytes, device);
               return reads ? st.submit_get(k, rows, oo) : st.submit_put(k, rows, oo);
             }));
             return f;
           }, py::arg("reads"), py::arg("keys"), py::arg("ptrs"), py::arg("device"), py::arg("keep"),
           py::arg("deadline_s") = py::none(), py::arg("stream") = 0,
           "Submits a get (reads) or put; stream: a CUstream handle (0 for none) the operation is ordered with.")
      .def("lookup", [](const store_object& s, const py::object& keys) {
             auto k = keys_of(keys);
             return s.call([&](kv::block_store& st) { return st.lookup(k); });
           })
      .def("prefix", [](const store_object& s, const py::object& keys) {
             auto k = keys_of(keys);
             return s.call([&](kv::block_store& st) { return st.prefix(k); });
           })
      .def("pin", [](const store_object& s, const py::object& keys) {
             auto k = keys_of(keys);
             return s.call([&](kv::block_store& st) { return st.pin(k); });
           })
      .def("unpin", [](const store_object& s, const py::object& keys) {
             auto k = keys_of(keys);
             s.call([&](kv::block_store& st) {
               st.unpin(k);
               return 0;
             });
           })
      .def("stats", [](const store_object& s) {
             return stats_dict(s.call([](kv::block_store& st) { return st.stats(); }));
           })
      .def("close", [](store_object& s) {
             py::gil_scoped_release unlocked;
             std::unique_lock lock(s.mutex);
             s.store.close();
           })
      .def_property_readonly("closed", [](const store_object& s) { return !s.store.is_open(); })
      .def_property_readonly("block_bytes", [](const store_object& s) {
             return s.call([](kv::block_store& st) { return st.options().block_bytes; });
           });
}
