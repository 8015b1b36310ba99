// gdskit._gdskit's batch API: submit_batch (many ranges, any files, host or GPU memory) returning a Batch whose
// fd, waits, cancel and results the Python facade (gdskit/_batch.py) turns into BatchFuture and BatchResult;
// read_npy_header and gather_rows for row gathers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "path_caster.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "file_object.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/gather.hpp"

namespace gdskit_python {
namespace {

using namespace std::chrono;

// One submitted batch: the future, and the file handles it reads (they stay open while it runs anyway; holding
// them here keeps their Python objects' view of them valid too).
struct batch_object {
  gdskit::batch_future future;
  std::vector<std::shared_ptr<const gdskit::file_handle>> files;

  const gdskit::batch_future& get() const {
    if (!future.valid()) throw py::value_error("the batch has been consumed");
    return future;
  }
};

gdskit::batch_options make_options(py::object deadline_s, unsigned queue_depth, bool exact, py::object coalesce_gap,
                                   std::uintptr_t stream) {
  gdskit::batch_options o;
  if (!deadline_s.is_none()) {
    const double s = deadline_s.cast<double>();
    if (!(s >= 0)) throw py::value_error("deadline_s must be >= 0 (seconds from now)");
    // Beyond a year is no deadline a caller means; it also keeps the clock arithmetic far from overflow.
    o.deadline = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(std::min(s, 3.2e7)));
  }
  o.queue_depth = queue_depth;
  o.exact = exact;
  if (!coalesce_gap.is_none()) o.coalesce_gap_bytes = coalesce_gap.cast<std::size_t>();
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

// [(nbytes, errno, message)] per range; errno 0 for success. CUDA and cuFile codes, which are not errno values,
// become EIO with the code named in the message.
py::tuple result_tuple(const gdskit::batch_result& r) {
  py::list items;
  for (const auto& x : r.ranges) {
    if (!x.error) {
      items.append(py::make_tuple(x.nbytes, 0, py::none()));
      continue;
    }
    const bool is_errno = x.error.category() == std::generic_category();
    const int code = is_errno ? x.error.value() : EIO;
    std::string msg = x.error.message();
    if (!is_errno) msg = std::string(x.error.category().name()) + " error " + std::to_string(x.error.value()) + ": " + msg;
    items.append(py::make_tuple(x.nbytes, code, msg));
  }
  py::dict routes;
  routes["host"] = r.routes.host;
  routes["staged"] = r.routes.staged;
  routes["gds"] = r.routes.gds;
  routes["requests"] = r.routes.requests;
  routes["buffered"] = r.routes.buffered;
  return py::make_tuple(items, r.nbytes, r.failed, r.seconds, routes);
}

}  // namespace

void register_batch(py::module_& m) {
  py::class_<batch_object, std::shared_ptr<batch_object>>(m, "Batch", "A submitted batch (see gdskit.BatchFuture).")
      .def("fileno", [](const batch_object& b) { return b.get().fd(); })
      .def("ready", [](const batch_object& b) { return b.get().ready(); })
      .def(
          "wait",
          [](const batch_object& b, py::object timeout) {
            const auto& f = b.get();
            const bool forever = timeout.is_none();
            const double s = forever ? 0.0 : std::clamp(timeout.cast<double>(), 0.0, 3.2e7);
            py::gil_scoped_release unlocked;
            if (forever) {
              f.wait();
              return true;
            }
            return f.wait_for(duration_cast<nanoseconds>(duration<double>(s)));
          },
          py::arg("timeout") = py::none())
      .def("cancel", [](const batch_object& b) { return b.get().cancel(); })
      .def("released", [](const batch_object& b) { return b.get().released(); })
      .def("wait_released",
           [](const batch_object& b) {
             const auto& f = b.get();
             py::gil_scoped_release unlocked;
             f.wait_released();
           })
      .def("result",
           [](const batch_object& b) {
             const auto& f = b.get();
             {
               py::gil_scoped_release unlocked;
               f.wait();
             }
             return result_tuple(f.get());
           });

  m.def(
      "submit_batch",
      [](bool write, const std::vector<std::shared_ptr<file_object>>& handles, const std::vector<std::uint32_t>& which,
         const std::vector<std::uint64_t>& offsets, const std::vector<std::uintptr_t>& ptrs,
         const std::vector<std::size_t>& sizes, const std::vector<int>& devices, py::object deadline_s,
         unsigned queue_depth, bool exact, py::object coalesce_gap, std::uintptr_t stream) {
        const std::size_t n = which.size();
        if (offsets.size() != n || ptrs.size() != n || sizes.size() != n || devices.size() != n) {
          throw py::value_error("submit_batch: the item lists differ in length");
        }
        auto b = std::make_shared<batch_object>();
        std::vector<std::shared_ptr<const gdskit::file_handle>> open;
        open.reserve(handles.size());
        for (const auto& h : handles) open.push_back(h->get());
        const gdskit::batch_options o = make_options(deadline_s, queue_depth, exact, coalesce_gap, stream);
        {
          py::gil_scoped_release unlocked;
          std::vector<gdskit::io_range> ranges(n);
          for (std::size_t i = 0; i < n; ++i) {
            if (which[i] >= open.size()) throw gdskit::error(gdskit::errno_code(EINVAL), "submit_batch: bad file index");
            void* p = reinterpret_cast<void*>(ptrs[i]);
            const gdskit::buffer_view v = devices[i] < 0 ? gdskit::buffer_view::host(p, sizes[i])
                                                         : gdskit::buffer_view{p, sizes[i], gdskit::memory_kind::device, devices[i]};
            ranges[i] = {open[which[i]].get(), offsets[i], v};
          }
          b->future = gdskit::submit(write ? gdskit::io_direction::write : gdskit::io_direction::read, ranges, o);
        }
        b->files = std::move(open);
        return b;
      },
      py::arg("write"), py::arg("handles"), py::arg("which"), py::arg("offsets"), py::arg("ptrs"), py::arg("sizes"),
      py::arg("devices"), py::arg("deadline_s") = py::none(), py::arg("queue_depth") = 0, py::arg("exact") = true,
      py::arg("coalesce_gap") = py::none(), py::arg("stream") = 0,
      "Submits ranges (item i: handles[which[i]], offsets[i], sizes[i] bytes at ptrs[i] on devices[i], -1 for host "
      "memory) and returns a Batch at once. Bad items raise OSError naming the item before any I/O.");

  m.def(
      "read_npy_header",
      [](const std::shared_ptr<file_object>& f) {
        const gdskit::npy_header h = gdskit::read_npy_header(*f->get());
        return py::make_tuple(h.descr, h.shape, h.data_offset_bytes, h.itemsize);
      },
      py::arg("handle"), "(descr, shape, data_offset, itemsize) of a .npy file.");

  m.def(
      "gather_rows",
      [](const std::shared_ptr<file_object>& f, std::uint64_t data_offset, std::size_t row_bytes, std::uint64_t nrows,
         std::uintptr_t indices_ptr, std::size_t count, std::uintptr_t out_ptr, std::size_t out_nbytes, int device,
         py::object deadline_s, unsigned queue_depth) {
        const auto h = f->get();
        const gdskit::batch_options o = make_options(deadline_s, queue_depth, true, py::none(), 0);
        gdskit::batch_result r;
        {
          py::gil_scoped_release unlocked;
          const gdskit::row_layout layout{data_offset, row_bytes, nrows};
          const std::span<const std::int64_t> idx(reinterpret_cast<const std::int64_t*>(indices_ptr), count);
          void* p = reinterpret_cast<void*>(out_ptr);
          const gdskit::buffer_view out = device < 0 ? gdskit::buffer_view::host(p, out_nbytes)
                                                     : gdskit::buffer_view{p, out_nbytes, gdskit::memory_kind::device, device};
          r = gdskit::gather_rows(*h, layout, idx, out, o);
        }
        return result_tuple(r);
      },
      py::arg("handle"), py::arg("data_offset"), py::arg("row_bytes"), py::arg("nrows"), py::arg("indices_ptr"),
      py::arg("count"), py::arg("out_ptr"), py::arg("out_nbytes"), py::arg("device"), py::arg("deadline_s") = py::none(),
      py::arg("queue_depth") = 0,
      "Reads rows at the int64 indices (count of them at indices_ptr, each in [0, nrows)) into out; returns the "
      "result tuple of a batch.");
}

}  // namespace gdskit_python
