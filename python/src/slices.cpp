// Slices of a tensor in an open safetensors file (safe_open(...).get_slice(name)[...]): only the byte ranges the
// slice needs are read, in one batch, straight into the destination (host or GPU memory).
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "bindings.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"

namespace gdskit::python {
namespace {

// Ranges closer than this are read as one request through the gap: the kernel reads whole pages anyway, and a
// request costs more than a page.
constexpr std::uint64_t k_gap_bytes = 4096;
// Memory a round of reads may hold beyond the slice itself: host staging for reading through gaps (and for
// packing those pieces before they go to a GPU) and the bookkeeping of its runs, so a slice of millions of
// tiny segments holds their offsets a bounded number at a time, as it holds their bytes.
constexpr std::uint64_t k_default_staging_bytes = std::uint64_t{64} << 20;

// One selected range of a dimension: `count` indices from `start`, `step` apart.
struct dim_pick {
  std::uint64_t start = 0;
  std::uint64_t count = 0;
  std::uint64_t step = 1;
};

// The segments of a slice in file order, one at a time: every segment is `bytes` long and contiguous in the
// file (the dimensions after the last partly selected one are taken whole).
class segment_walk {
 public:
  segment_walk(const std::vector<std::uint64_t>& shape, std::uint64_t elem, const std::vector<dim_pick>& picks) {
    const std::size_t n = shape.size();
    std::vector<std::uint64_t> stride(n, elem);
    for (std::size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
    std::size_t k = n;
    while (k > 0 && picks[k - 1].start == 0 && picks[k - 1].step == 1 && picks[k - 1].count == shape[k - 1]) --k;
    bytes_ = elem;
    for (std::size_t d = k; d < n; ++d) bytes_ *= shape[d];
    if (k == 0) {
      total_ = 1;
      return;
    }
    // Dimension k-1 is the last partly selected one: with step 1 its run is one segment, else each index is.
    const dim_pick& last = picks[k - 1];
    std::size_t walked = k;
    if (last.step == 1) {
      bytes_ *= last.count;
      base_ = last.start * stride[k - 1];
      walked = k - 1;
    }
    for (std::size_t d = 0; d < walked; ++d) dims_.push_back({picks[d], stride[d]});
    total_ = 1;
    for (const auto& dm : dims_) total_ *= dm.pick.count;
    at_.assign(dims_.size(), 0);
  }

  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t count() const { return total_; }
  /// The file offset (relative to the tensor) of the next segment; call count() times.
  std::uint64_t next() {
    std::uint64_t off = base_;
    for (std::size_t d = 0; d < dims_.size(); ++d) {
      off += (dims_[d].pick.start + at_[d] * dims_[d].pick.step) * dims_[d].stride;
    }
    for (std::size_t d = dims_.size(); d-- > 0;) {  // odometer, last dimension fastest
      if (++at_[d] < dims_[d].pick.count) break;
      at_[d] = 0;
    }
    return off;
  }

 private:
  struct walked_dim {
    dim_pick pick;
    std::uint64_t stride;
  };
  std::vector<walked_dim> dims_;
  std::vector<std::uint64_t> at_;
  std::uint64_t bytes_ = 0;
  std::uint64_t base_ = 0;
  std::uint64_t total_ = 0;
};

// A run of segments read by one request: `span` bytes of `file` from `offset`, whose segments (`seg` bytes each)
// go to `out` one after another.
struct run {
  const file_handle* file = nullptr;
  std::uint64_t offset = 0;
  std::uint64_t span = 0;
  std::uint64_t seg = 0;
  buffer_view out;                    // set when the run is closed
  std::vector<std::uint64_t> starts;  // segment offsets within the span; empty when the segments touch

  std::uint64_t out_bytes() const { return starts.empty() ? span : starts.size() * seg; }
};

// Bookkeeping of one run in a round, beyond its segment offsets: the run, its range and its result (each in a
// vector that may hold twice what it uses), and the transfer core's own state for the range (estimated).
constexpr std::uint64_t k_run_cost_bytes = 2 * (sizeof(run) + sizeof(io_range) + sizeof(range_result)) + 128;

bool host_memory(const buffer_view& b) { return b.kind == memory_kind::host || b.kind == memory_kind::pinned; }

// Reads runs in rounds bounded by the staging memory, each round one batch across every file: touching runs
// straight into their destination, runs with gaps into host staging, from which their segments are copied into
// place (packed first, then one copy per run, for a GPU).
class slice_reader {
 public:
  explicit slice_reader(std::uint64_t staging_bytes) : budget_(staging_bytes) {}

  std::uint64_t budget() const { return budget_; }

  void add(run r) {
    if (staged_ + cost(r) > budget_ && !runs_.empty()) flush();
    staged_ += cost(r);
    runs_.push_back(std::move(r));
  }

  /// The memory a run holds while its round is pending: staging for its span (and packing for a GPU), its
  /// segment offsets and its bookkeeping.
  static std::uint64_t cost(const run& r) {
    return staged_bytes(r) + r.starts.capacity() * sizeof(std::uint64_t) + k_run_cost_bytes;
  }

  void flush() {
    if (runs_.empty()) return;
    std::uint64_t staging_bytes = 0;
    for (const run& r : runs_) staging_bytes += staged_bytes(r);
    std::vector<std::uint8_t> staging(staging_bytes);
    std::vector<io_range> ranges;
    ranges.reserve(runs_.size());
    std::vector<std::uint64_t> where(runs_.size());
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      const run& r = runs_[i];
      buffer_view into = r.out;
      if (!r.starts.empty()) {
        where[i] = at;
        into = buffer_view::host(staging.data() + at, r.span);
        at += staged_bytes(r);
      }
      ranges.push_back({r.file, r.offset, into});
    }
    batch_options o;
    o.exact = true;
    const batch_result res = gdskit::transfer(io_direction::read, ranges, o);
    // What this round held, measured from its containers (the transfer core's own state aside).
    std::uint64_t held = staging.capacity() + runs_.capacity() * sizeof(run) + ranges.capacity() * sizeof(io_range) +
                         where.capacity() * sizeof(std::uint64_t) + res.ranges.capacity() * sizeof(range_result);
    for (const run& r : runs_) held += r.starts.capacity() * sizeof(std::uint64_t);
    peak_held_ = std::max(peak_held_, held);
    for (std::size_t i = 0; i < res.ranges.size(); ++i) {
      const auto& rr = res.ranges[i];
      if (rr.ok()) continue;
      const run& r = runs_[i];
      const bool short_file = rr.error == std::errc::no_message_available;
      throw error(short_file ? errno_code(EIO) : rr.error, "read", r.file->path().string(),
                  static_cast<std::int64_t>(r.offset), r.span,
                  short_file ? fmt::format("file ended after {} of {} bytes", rr.nbytes, r.span) : "");
    }
    bytes_read_ += res.nbytes;
    requests_ += res.ranges.size();
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      const run& r = runs_[i];
      if (r.starts.empty()) continue;
      const std::uint8_t* span = staging.data() + where[i];
      // Host memory takes the segments in place; for a GPU they are packed behind the span, then copied once.
      auto* packed = host_memory(r.out) ? static_cast<std::uint8_t*>(r.out.data) : staging.data() + where[i] + r.span;
      for (std::size_t k = 0; k < r.starts.size(); ++k) std::memcpy(packed + k * r.seg, span + r.starts[k], r.seg);
      if (!host_memory(r.out)) copy_into(r.out, 0, packed, r.out_bytes());
    }
    runs_ = {};  // its room goes too: the next round may be a few large runs after many small ones
    staged_ = 0;
  }

  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t requests() const { return requests_; }
  /// The most memory one round held beyond the destinations: staging, segment offsets, ranges and results.
  std::uint64_t peak_held() const { return peak_held_; }

 private:
  static std::uint64_t staged_bytes(const run& r) {
    return r.starts.empty() ? 0 : r.span + (host_memory(r.out) ? 0 : r.out_bytes());
  }

  std::uint64_t budget_;
  std::vector<run> runs_;
  std::uint64_t staged_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::uint64_t requests_ = 0;
  std::uint64_t peak_held_ = 0;
};

// Adds the runs of the slice `picks` (one per dimension) of the tensor at `tensor_offset` of `f`, of element
// shape `shape` and `elem` bytes per element, whose bytes go to `dst` in C order.
void add_slice(slice_reader& reader, const file_handle& f, std::uint64_t tensor_offset,
               const std::vector<std::uint64_t>& shape, std::uint64_t elem, const std::vector<dim_pick>& picks,
               buffer_view dst) {
  segment_walk walk(shape, elem, picks);
  const std::uint64_t seg = walk.bytes();
  if (walk.count() * seg > dst.nbytes) {
    throw error(errno_code(EINVAL), "read slice", f.path().string(), -1, 0,
                fmt::format("the destination holds {} bytes, the slice {}", dst.nbytes, walk.count() * seg));
  }
  run current;
  std::uint64_t out = 0;
  auto close = [&] {
    current.out = dst.sub(out, current.out_bytes());
    out += current.out_bytes();
    reader.add(std::move(current));
  };
  bool open = false;
  for (std::uint64_t i = 0; i < walk.count(); ++i) {
    const std::uint64_t off = tensor_offset + walk.next();
    const std::uint64_t end = current.offset + current.span;
    // A run grows while it holds at most half the round's memory (its span, and a GPU's packed copy, plus its
    // offsets once it has gaps), so that a round is never one run over the budget.
    // (Offsets may hold twice the room they use, as a vector grows.)
    const std::uint64_t grown = off + seg - current.offset;
    if (open && off >= end && off - end <= k_gap_bytes &&
        grown + (grown / seg + 1) * (2 * sizeof(std::uint64_t) + seg) + k_run_cost_bytes <= reader.budget() / 2) {
      if (off > end && current.starts.empty()) {
        // The first gap: the run so far becomes explicit segments.
        for (std::uint64_t s = 0; s < current.span; s += seg) current.starts.push_back(s);
      }
      if (!current.starts.empty()) current.starts.push_back(off - current.offset);
      current.span = off + seg - current.offset;
    } else {
      if (open) close();
      current = run{&f, off, seg, seg, {}, {}};
      open = true;
    }
  }
  if (open) close();
}

std::vector<dim_pick> checked_picks(const std::vector<std::uint64_t>& shape,
                                    const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>& picks) {
  if (picks.size() != shape.size()) throw py::value_error("read_slice: one pick per dimension");
  std::vector<dim_pick> out;
  for (std::size_t d = 0; d < picks.size(); ++d) {
    const auto& [start, count, step] = picks[d];
    if (step == 0 || start >= shape[d] || (count > 0 && (count - 1) > (shape[d] - 1 - start) / step)) {
      throw py::index_error(fmt::format("read_slice: dimension {} picks beyond its {} entries", d, shape[d]));
    }
    out.push_back({start, count, step});
  }
  return out;
}

// One dimension of a Python index, numpy's rules: an int picks one entry (negative counts from the end) and
// drops the dimension; a slice picks a range with a positive step.
struct index_pick {
  dim_pick pick;
  bool keep = true;
};

index_pick pick_of(py::handle item, std::size_t dim, std::uint64_t n) {
  if (PySlice_Check(item.ptr())) {
    Py_ssize_t start = 0, stop = 0, step = 0;
    if (PySlice_Unpack(item.ptr(), &start, &stop, &step) != 0) throw py::error_already_set();
    if (n > static_cast<std::uint64_t>(PY_SSIZE_T_MAX)) throw py::value_error("dimension too large to slice");
    const Py_ssize_t count = PySlice_AdjustIndices(static_cast<Py_ssize_t>(n), &start, &stop, step);
    if (step <= 0) throw py::value_error(fmt::format("slice step must be positive, not {}", step));
    return {{static_cast<std::uint64_t>(start), static_cast<std::uint64_t>(count), static_cast<std::uint64_t>(step)},
            true};
  }
  if (PyBool_Check(item.ptr()) || !PyIndex_Check(item.ptr())) {
    throw py::type_error(fmt::format("index {} of dimension {}: only ints, slices and ... are supported",
                                     py::repr(item).cast<std::string>(), dim));
  }
  py::int_ value = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr()));
  if (!value) throw py::error_already_set();
  int overflow = 0;
  const long long i = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (i == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  const auto signed_n = static_cast<long long>(std::min<std::uint64_t>(n, LLONG_MAX));
  if (overflow != 0 || i < -signed_n || i >= signed_n) {
    throw py::index_error(fmt::format("index {} is out of bounds for dimension {} with size {}",
                                      py::str(value).cast<std::string>(), dim, n));
  }
  return {{static_cast<std::uint64_t>(i < 0 ? i + signed_n : i), 1, 1}, false};
}

// The picks of `index` (an int, a slice, ... or a tuple of them) on a tensor of `shape`: one per dimension, the
// dimensions after the given ones taken whole, one ... standing for as many whole dimensions as needed.
std::vector<index_pick> picks_of_index(py::handle index, const std::vector<std::uint64_t>& shape) {
  if (PyList_Check(index.ptr())) {
    throw py::type_error("lists are not supported as slice indices: use ints, slices and ...");
  }
  std::vector<py::handle> items;
  if (PyTuple_Check(index.ptr())) {
    for (py::handle h : py::reinterpret_borrow<py::tuple>(index)) items.push_back(h);
  } else {
    items.push_back(index);
  }
  const auto ellipsis = std::count_if(items.begin(), items.end(), [](py::handle h) { return h.ptr() == Py_Ellipsis; });
  if (ellipsis > 1) throw py::index_error("an index can only have a single ellipsis ('...')");
  std::vector<std::optional<py::handle>> full;  // nullopt: the whole dimension
  for (py::handle h : items) {
    if (h.ptr() != Py_Ellipsis) {
      full.emplace_back(h);
      continue;
    }
    const std::size_t given = items.size() - 1;
    for (std::size_t k = given; k < shape.size(); ++k) full.emplace_back(std::nullopt);
  }
  if (full.size() > shape.size()) {
    throw py::index_error(fmt::format("too many indices for tensor of dimension {}", shape.size()));
  }
  full.resize(shape.size());
  std::vector<index_pick> out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    out.push_back(full[d] ? pick_of(*full[d], d, shape[d]) : index_pick{{0, shape[d], 1}, true});
  }
  return out;
}

}  // namespace

void register_slices(py::module_& m) {
  m.def(
      "slice_picks",
      [](py::handle index, const std::vector<std::uint64_t>& shape, std::uint64_t elem) {
        const auto picks = picks_of_index(index, shape);
        std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> out;
        std::vector<std::uint64_t> kept;
        std::uint64_t nbytes = elem;
        for (const auto& p : picks) {
          out.emplace_back(p.pick.start, p.pick.count, p.pick.step);
          if (p.keep) kept.push_back(p.pick.count);
          nbytes *= p.pick.count;  // at most the tensor's own bytes, which the header parser bounded
        }
        return py::make_tuple(out, kept, nbytes);
      },
      py::arg("index"), py::arg("shape"), py::arg("elem"),
      "What safe_open(...).get_slice(name)[index] reads, numpy's indexing rules applied to `index` (ints, "
      "slices with a positive step, one ...) on a tensor of element shape `shape`, `elem` bytes per element: "
      "([(start, count, step)] per dimension as read_slice takes them, the result's shape, its bytes). "
      "IndexError, TypeError or ValueError for an index it cannot take.");
  m.attr("SLICE_MEMORY_BYTES") = k_default_staging_bytes;
  m.def(
      "read_slice",
      [](const file_object& file, std::uint64_t tensor_offset, const std::vector<std::uint64_t>& shape,
         std::uint64_t elem, const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>& picks,
         std::uintptr_t ptr, std::size_t nbytes, int device, std::uint64_t staging_bytes) {
        const auto p = checked_picks(shape, picks);
        const auto h = file.get();
        py::gil_scoped_release unlocked;
        slice_reader reader(std::max<std::uint64_t>(staging_bytes, 2));
        add_slice(reader, *h, tensor_offset, shape, elem, p, view_for(ptr, nbytes, device));
        reader.flush();
        return std::make_tuple(reader.bytes_read(), reader.requests(), reader.peak_held());
      },
      py::arg("file"), py::arg("tensor_offset"), py::arg("shape"), py::arg("elem"), py::arg("picks"), py::arg("ptr"),
      py::arg("nbytes"), py::arg("device"), py::arg("staging_bytes") = k_default_staging_bytes,
      "Reads a slice of a tensor: picks [(start, count, step)] per dimension of its element shape, `elem` bytes "
      "per element, into memory at ptr (device -1: host) in C order. Ranges closer than a page are read as one "
      "request through the gap; the memory the read holds beyond the slice (staging and the ranges' bookkeeping) "
      "stays within about staging_bytes. Returns (bytes read, requests, the most memory a round held beyond the "
      "destination).");

  m.def(
      "read_slices",
      [](const std::vector<std::tuple<std::string, std::uint64_t, std::vector<std::uint64_t>, std::uint64_t,
                                      std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>,
                                      std::uintptr_t, std::size_t, int>>& items) {
        std::vector<std::vector<dim_pick>> picks;
        for (const auto& item : items) picks.push_back(checked_picks(std::get<2>(item), std::get<4>(item)));
        py::gil_scoped_release unlocked;
        std::map<std::string, file_handle> files;  // each file opened once (st::open_file: regular files only)
        for (const auto& item : items) {
          const auto& path = std::get<0>(item);
          if (!files.count(path)) files.emplace(path, st::open_file(path));
        }
        slice_reader reader(k_default_staging_bytes);
        for (std::size_t i = 0; i < items.size(); ++i) {
          const auto& [path, offset, shape, elem, pick, ptr, nbytes, device] = items[i];
          add_slice(reader, files.at(path), offset, shape, elem, picks[i], view_for(ptr, nbytes, device));
        }
        reader.flush();
        return reader.bytes_read();
      },
      py::arg("items"),
      "read_slice for many tensors of many files, as batches across all of them: items [(path, tensor_offset, "
      "shape, elem, picks, ptr, nbytes, device)]. Returns the bytes read. Each file is opened once, for reading, "
      "and must be a regular file.");
}

}  // namespace gdskit::python
