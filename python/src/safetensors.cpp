// Safetensors loads, headers and the shard plans the distributed save shares with the single-process one.
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "formats/safetensors_load.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {

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

void register_safetensors(py::module_& m) {
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
          tensors[py::str(t.name)] = py::cast(tensor_handle::make(keep, t.data, t.dtype, t.shape));
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
      "load_bytes",
      [](py::buffer data, py::object allocate) {
        const py::buffer_info in = data.request();
        if (in.ndim != 1 || in.itemsize != 1 || (in.ndim == 1 && in.strides[0] != 1)) {
          throw py::type_error("load: data must be bytes or a contiguous byte buffer");
        }
        const auto* base = static_cast<const std::uint8_t*>(in.ptr);
        const std::size_t n = static_cast<std::size_t>(in.size);
        const st::header h = st::parse_header(base, n, n, "");
        const std::size_t data_n = n - static_cast<std::size_t>(h.data_offset_bytes);
        // The tensors' bytes are copied once, into memory the caller's allocator gives (a torch tensor) or
        // into memory of their own, so they outlive `data` as safetensors' do.
        std::shared_ptr<void> keep;
        std::uint8_t* dst = nullptr;
        if (!allocate.is_none()) {
          py::tuple r = allocate(data_n);
          auto owner = std::make_shared<py_owner>(py::object(r[2]));
          dst = reinterpret_cast<std::uint8_t*>(r[0].cast<std::uintptr_t>());
          if (r[1].cast<std::size_t>() < data_n) throw py::value_error("load: the allocation is too small");
          keep = owner;
        } else {
          auto bytes = std::make_shared<std::vector<std::uint8_t>>(data_n);
          dst = bytes->data();
          keep = bytes;
        }
        if (data_n > 0) std::memcpy(dst, base + h.data_offset_bytes, data_n);
        py::dict tensors;
        for (const auto& t : h.tensors) {
          const auto view = gdskit::buffer_view::host(dst + t.begin_bytes, static_cast<std::size_t>(t.nbytes()));
          tensors[py::str(t.name)] = py::cast(tensor_handle::make(keep, view, t.dtype, t.shape));
        }
        return py::make_tuple(tensors, h.metadata);
      },
      py::arg("data"), py::arg("allocate") = py::none(),
      "Parses a safetensors file held in memory: ({name: Tensor} in data order, metadata). The tensors' bytes "
      "are copied into allocate(nbytes) -> (address, nbytes, owner), a host allocation, or memory of their own.");

  m.def("header", [](const std::filesystem::path& path) {
    return header_tuple(st::read_header(path));
  }, py::arg("path"), "The validated header: ([{name, dtype, shape, data_offsets, file_offset}], metadata).");

  // Distributed load (gdskit/distributed.py): the files a path stands for, resolved as load() does.
  m.def("resolve_shards", [](const std::filesystem::path& path) {
    py::list out;
    for (const auto& s : st::resolve_shards(path)) out.append(py::make_tuple(s.file.string(), s.names));
    return out;
  }, py::arg("path"), "The files of a file, index or folder in load order: [(file, [names the index assigns])].");

  // Distributed load: the loader's rules for names, rows and byte ranges, so the planner of the ranks uses the
  // same ones.
  m.attr("LOAD_DIRECT_SEGMENT_BYTES") = formats::direct_segment_bytes;
  m.def("name_matches", &st::name_matches, py::arg("entry"), py::arg("name"),
        "Whether an only= entry selects the tensor called name: the name itself, or a prefix ending in '.' or "
        "'*' ('*' removed).");
  m.def("split_rows", &st::split_rows, py::arg("n"), py::arg("rank"), py::arg("world"),
        "(first row, row count) of a dimension of size n that rank `rank` of `world` loads (numpy.array_split).");
  m.def(
      "slice_plan",
      [](const std::string& dtype, const std::vector<std::uint64_t>& shape, unsigned dim, unsigned rank,
         unsigned world) {
        const auto dt = st::parse_dtype(dtype);
        if (!dt) throw py::value_error("unknown safetensors dtype " + py::repr(py::str(dtype)).cast<std::string>());
        st::tensor_info t;
        t.dtype = *dt;
        t.shape = shape;
        std::uint64_t numel = 1;
        for (auto d : shape) {
          if (d != 0 && numel > UINT64_MAX / 64 / d) throw py::value_error("slice_plan: the shape overflows");
          numel *= d;
        }
        t.end_bytes = numel * st::bits_of(*dt) / 8;
        const auto p = st::plan_slice(t, st::slice_spec{rank, world, dim});
        return py::make_tuple(p.first_offset, p.segment_bytes, p.stride_bytes, p.segments, p.row_bytes);
      },
      py::arg("dtype"), py::arg("shape"), py::arg("dim"), py::arg("rank"), py::arg("world"),
      "The byte ranges a load reads for rank `rank` of `world` of a tensor split along `dim`, relative to its "
      "first byte: (first offset, bytes per segment, distance between segments, segments, bytes of one index of "
      "`dim`).");

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
}

}  // namespace gdskit::python
