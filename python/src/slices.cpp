// Slices of a tensor in an open safetensors file (safe_open(...).get_slice(name)[...]): only the byte ranges the
// slice needs are read, in one batch, straight into the destination (host or GPU memory).
#include <algorithm>
#include <cerrno>
#include <cstring>
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
// Host memory for reading through gaps (and for packing those pieces before they go to a GPU), per round.
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

// A run of segments read by one request: `span` file bytes from `offset`, holding `segments` segments whose
// bytes go to the destination from `out`.
struct run {
  std::uint64_t offset = 0;
  std::uint64_t span = 0;
  std::uint64_t out = 0;
  std::vector<std::uint64_t> starts;  // segment offsets within the span; empty when the segments touch
};

// Reads runs in rounds bounded by the staging memory: touching runs straight into the destination, runs with
// gaps into host staging, from which their segments are copied into place (packed first for a GPU).
class slice_reader {
 public:
  slice_reader(const file_handle& f, std::uint64_t tensor_offset, std::uint64_t seg, buffer_view dst,
               std::uint64_t staging_bytes)
      : f_(f), base_(tensor_offset), seg_(seg), dst_(dst), budget_(staging_bytes) {}

  void add(run r) {
    const std::uint64_t staged = r.starts.empty() ? 0 : r.span + (host() ? 0 : r.starts.size() * seg_);
    if (staged_ + staged > budget_ && !runs_.empty()) flush();
    staged_ += staged;
    runs_.push_back(std::move(r));
  }

  void flush() {
    std::vector<std::uint8_t> staging(staged_);
    std::vector<io_range> ranges;
    ranges.reserve(runs_.size());
    std::uint64_t at = 0;
    std::vector<std::uint64_t> where(runs_.size());
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      const run& r = runs_[i];
      buffer_view into;
      if (r.starts.empty()) {
        into = dst_.sub(r.out, r.span);
      } else {
        where[i] = at;
        into = buffer_view::host(staging.data() + at, r.span);
        at += r.span + (host() ? 0 : r.starts.size() * seg_);
      }
      ranges.push_back({&f_, base_ + r.offset, into});
    }
    batch_options o;
    o.exact = true;
    const batch_result res = gdskit::transfer(io_direction::read, ranges, o);
    for (std::size_t i = 0; i < res.ranges.size(); ++i) {
      const auto& rr = res.ranges[i];
      if (rr.ok()) continue;
      const bool short_file = rr.error == std::errc::no_message_available;
      throw error(short_file ? errno_code(EIO) : rr.error, "read slice", f_.path().string(),
                  static_cast<std::int64_t>(base_ + runs_[i].offset), runs_[i].span,
                  short_file ? fmt::format("file ended after {} of {} bytes", rr.nbytes, runs_[i].span) : "");
    }
    bytes_read_ += res.nbytes;
    requests_ += res.ranges.size();
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      const run& r = runs_[i];
      if (r.starts.empty()) continue;
      const std::uint8_t* span = staging.data() + where[i];
      if (host()) {
        auto* out = static_cast<std::uint8_t*>(dst_.data) + r.out;
        for (std::size_t s = 0; s < r.starts.size(); ++s) std::memcpy(out + s * seg_, span + r.starts[s], seg_);
      } else {
        // Packed behind the span, then one copy to the GPU per run.
        std::uint8_t* packed = staging.data() + where[i] + r.span;
        for (std::size_t s = 0; s < r.starts.size(); ++s) std::memcpy(packed + s * seg_, span + r.starts[s], seg_);
        copy_into(dst_, r.out, packed, r.starts.size() * seg_);
      }
    }
    runs_.clear();
    staged_ = 0;
  }

  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t requests() const { return requests_; }

 private:
  bool host() const { return dst_.kind == memory_kind::host || dst_.kind == memory_kind::pinned; }

  const file_handle& f_;
  std::uint64_t base_;
  std::uint64_t seg_;
  buffer_view dst_;
  std::uint64_t budget_;
  std::vector<run> runs_;
  std::uint64_t staged_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::uint64_t requests_ = 0;
};

// Reads the slice `picks` (one per dimension) of the tensor at `tensor_offset` of `f`, of element shape `shape`
// and `elem` bytes per element, into `dst`, with at most about `staging_bytes` of host memory per round; returns
// (bytes read, requests).
std::pair<std::uint64_t, std::uint64_t> read_slice(const file_handle& f, std::uint64_t tensor_offset,
                                                   const std::vector<std::uint64_t>& shape, std::uint64_t elem,
                                                   const std::vector<dim_pick>& picks, buffer_view dst,
                                                   std::uint64_t staging_bytes) {
  segment_walk walk(shape, elem, picks);
  const std::uint64_t seg = walk.bytes();
  if (walk.count() * seg > dst.nbytes) {
    throw error(errno_code(EINVAL), "read slice", f.path().string(), -1, 0,
                fmt::format("the destination holds {} bytes, the slice {}", dst.nbytes, walk.count() * seg));
  }
  slice_reader reader(f, tensor_offset, seg, dst, staging_bytes);
  run current;
  std::uint64_t out = 0;
  bool open = false;
  for (std::uint64_t i = 0; i < walk.count(); ++i) {
    const std::uint64_t off = walk.next();
    if (open && off >= current.offset + current.span && off - (current.offset + current.span) <= k_gap_bytes &&
        off + seg - current.offset <= staging_bytes / 2) {
      const std::uint64_t gap = off - (current.offset + current.span);
      if (gap > 0 && current.starts.empty()) {
        // The first gap: the run so far becomes explicit segments.
        for (std::uint64_t s = 0; s < current.span; s += seg) current.starts.push_back(s);
      }
      if (!current.starts.empty()) current.starts.push_back(off - current.offset);
      current.span = off + seg - current.offset;
    } else {
      if (open) {
        out += current.starts.empty() ? current.span : current.starts.size() * seg;
        reader.add(std::move(current));
      }
      current = run{off, seg, out, {}};
      open = true;
    }
  }
  if (open) reader.add(std::move(current));
  reader.flush();
  return {reader.bytes_read(), reader.requests()};
}

}  // namespace

void register_slices(py::module_& m) {
  m.def(
      "read_slice",
      [](const file_object& file, std::uint64_t tensor_offset, const std::vector<std::uint64_t>& shape,
         std::uint64_t elem, const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>& picks,
         std::uintptr_t ptr, std::size_t nbytes, int device, std::uint64_t staging_bytes) {
        if (picks.size() != shape.size()) throw py::value_error("read_slice: one pick per dimension");
        std::vector<dim_pick> p;
        for (std::size_t d = 0; d < picks.size(); ++d) {
          const auto& [start, count, step] = picks[d];
          if (step == 0 || (count > 0 && start + (count - 1) * step >= shape[d])) {
            throw py::index_error(fmt::format("read_slice: dimension {} picks beyond its {} entries", d, shape[d]));
          }
          p.push_back({start, count, step});
        }
        const auto h = file.get();
        py::gil_scoped_release unlocked;
        return read_slice(*h, tensor_offset, shape, elem, p, view_for(ptr, nbytes, device),
                          std::max<std::uint64_t>(staging_bytes, 2));
      },
      py::arg("file"), py::arg("tensor_offset"), py::arg("shape"), py::arg("elem"), py::arg("picks"), py::arg("ptr"),
      py::arg("nbytes"), py::arg("device"), py::arg("staging_bytes") = k_default_staging_bytes,
      "Reads a slice of a tensor: picks [(start, count, step)] per dimension of its element shape, `elem` bytes "
      "per element, into memory at ptr (device -1: host) in C order. Ranges closer than a page are read as one "
      "request through the gap, through at most about staging_bytes of host memory at a time; returns (bytes read, "
      "requests).");
}

}  // namespace gdskit::python
