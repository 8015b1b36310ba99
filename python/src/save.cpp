// Saves: safetensors files and sharded checkpoints (the facade is gdskit/_save.py).
#include <poll.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "formats/memory_overlap.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {
namespace {

// One entry of the facade's list: (name, framework, dtype, shape, address, nbytes, device, source or None), with
// the framework ("torch" or "numpy") and its dtype name and shape: the table in dtypes.cpp gives the file's.
// source(offset) -> (address, nbytes), for strided tensors staged piece by piece.
using save_entry = std::tuple<std::string, std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t,
                              std::size_t, int, py::object>;

std::vector<st::save_tensor> to_save_tensors(const std::vector<save_entry>& entries) {
  std::vector<st::save_tensor> out;
  out.reserve(entries.size());
  for (const auto& [name, framework, dtype_name, shape, ptr, nbytes, device, source] : entries) {
    const st::dtype dt = dtype_from_framework(framework, dtype_name, name);
    st::save_tensor t{name, dt, file_shape(dt, shape), {}, {}};
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

// A tensor of a save as the shared-memory check takes it: (name, space, address, itemsize, shape, strides).
// Torch strides count elements, numpy strides bytes (the `exact` flag of refuse_shared says which).
using shared_entry = std::tuple<std::string, std::string, std::uintptr_t, std::size_t, std::vector<std::uint64_t>,
                                std::vector<std::int64_t>>;

// RuntimeError naming the groups (a list of sets of names, between `before` and `after`) when any tensors share
// memory.
void refuse_shared(const std::vector<shared_entry>& entries, bool exact, const char* before, const char* after) {
  std::vector<formats::memory_layout> layouts;
  layouts.reserve(entries.size());
  for (const auto& [name, space, address, itemsize, shape, strides] : entries) {
    formats::memory_layout l{space, address, itemsize, shape, strides, exact};
    // Torch strides are in elements.
    if (!exact)
      for (auto& s : l.strides_bytes) s *= static_cast<std::int64_t>(itemsize);
    layouts.push_back(std::move(l));
  }
  const auto groups = formats::shared_memory_groups(layouts);
  if (groups.empty()) return;
  py::list failing;
  for (const auto& g : groups) {
    py::set names;
    for (std::size_t i : g) names.add(py::str(std::get<0>(entries[i])));
    failing.append(names);
  }
  throw std::runtime_error(before + py::repr(failing).cast<std::string>() + after);
}

// Whether `fd` has bytes to read, without reading them (they are the facade's to pass on).
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace

void register_save(py::module_& m) {
  m.def(
      "save",
      [](const std::filesystem::path& path, const std::vector<save_entry>& entries,
         std::optional<st::metadata_entries> metadata, bool overwrite, bool sharded, std::uint64_t max_shard_bytes,
         int signal_fd) {
        auto tensors = to_save_tensors(entries);
        st::save_options o;
        o.overwrite = overwrite;
        o.max_shard_bytes = max_shard_bytes;
        // The save runs on this thread, its writes in the transfer core. A signal (Ctrl-C) makes `signal_fd`
        // readable (the facade made it Python's wakeup descriptor): the core's threads see that between pieces
        // and stop the save (nothing is published); the signal's handler then runs here and raises.
        o.cancelled = [signal_fd] { return signal_fd >= 0 && readable(signal_fd); };
        st::save_stats s;
        try {
          py::gil_scoped_release unlocked;
          s = sharded ? st::save_sharded(path, tensors, metadata, o) : st::save(path, tensors, metadata, o);
        } catch (const gdskit::error& e) {
          if (e.code() == std::errc::operation_canceled && PyErr_CheckSignals() != 0) throw py::error_already_set();
          throw;  // the module's translator makes it a Python exception
        }
        return save_stats_dict(s);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"), py::arg("overwrite"), py::arg("sharded"),
      py::arg("max_shard_bytes"), py::arg("signal_fd") = -1,
      "Saves [(name, framework, dtype, shape, address, nbytes, device, source)] to a file (or a sharded folder) "
      "on this thread; returns stats. signal_fd >= 0: a descriptor that becomes readable when a signal arrives "
      "(Python's wakeup descriptor): the save stops between pieces and the signal's handler runs.");

  m.def(
      "save_bytes",
      [](const std::vector<save_entry>& entries, std::optional<st::metadata_entries> metadata) {
        const auto tensors = to_save_tensors(entries);
        const auto layout = st::plan_save(tensors, metadata);
        py::bytes out(nullptr, layout.file_nbytes());  // the bytes object is filled in place: one copy
        char* dst = PyBytes_AsString(out.ptr());
        if (dst == nullptr) throw py::error_already_set();
        {
          py::gil_scoped_release unlocked;
          st::write_to_memory(tensors, layout, dst);
        }
        return out;
      },
      py::arg("tensors"), py::arg("metadata"),
      "The bytes of the safetensors file a save of these tensors writes (what safetensors.torch.save returns).");

  m.def(
      "check_shared_memory",
      [](const std::vector<shared_entry>& tensors, const std::vector<shared_entry>& arrays) {
        // Torch tensors: within one storage, memory from first to last element (the safetensors rule); numpy
        // arrays: their bytes exactly (interleaved strided views share nothing).
        refuse_shared(tensors, false,
                      "Some tensors share memory, this will lead to duplicate memory on disk and potential "
                      "differences when loading them again: ",
                      ". Save one tensor per storage (clone the others) instead.");
        refuse_shared(arrays, true, "Some arrays share memory: ", ". Save one array per buffer (copy the others).");
      },
      py::arg("tensors"), py::arg("arrays"),
      "Raises RuntimeError naming the groups of tensors whose memory overlaps. tensors: torch tensors as [(name, "
      "storage, address, itemsize, shape, strides in elements)], compared within one storage (a key) from first to "
      "last element; arrays: numpy arrays as [(name, address, itemsize, shape, strides in bytes)], compared byte "
      "for byte. Sorted by address: n log n for tensors in memory of their own.");

  m.def(
      "parse_shard_size",
      [](py::object size) -> std::uint64_t {
        if (!PyBool_Check(size.ptr()) && PyLong_Check(size.ptr())) {
          // 1 to 2^64 - 1: a negative int or one of 2^64 or more is the ValueError below, not an OverflowError.
          const unsigned long long n = PyLong_AsUnsignedLongLong(size.ptr());
          if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
            PyErr_Clear();
          } else if (n > 0) {
            return n;
          }
        } else if (py::isinstance<py::str>(size)) {
          if (auto n = st::parse_shard_size(size.cast<std::string>())) return *n;
        }
        throw py::value_error("max_shard_size must be 1 to 2**64-1 bytes or a size such as \"5GB\", "
                              "\"500MB\" (decimal) or \"2GiB\" (binary), not " + py::repr(size).cast<std::string>());
      },
      py::arg("size"), "max_shard_size in bytes: an int, or a text huggingface_hub accepts (\"5GB\") or \"2GiB\".");
}

}  // namespace gdskit::python
