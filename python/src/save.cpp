// Saves: safetensors files and sharded checkpoints (the facade is gdskit/_save.py).
#include <atomic>
#include <cerrno>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {
namespace {

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

}  // namespace

void register_save(py::module_& m) {
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

}  // namespace gdskit::python
