// Loading safetensors files and sharded checkpoints into host or GPU memory.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <unordered_map>

#include "common/arith.hpp"
#include "formats/safetensors_index.hpp"
#include "formats/safetensors_load.hpp"
#include "formats/safetensors_open.hpp"
#include "formats/sha256.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"

namespace gdskit::safetensors {

namespace {

constexpr std::size_t k_host_alignment = 4096;
constexpr std::uint64_t k_direct_segment_bytes = formats::direct_segment_bytes;

[[noreturn]] void invalid(const std::string& what) {
  throw error(errno_code(EINVAL), "safetensors load: " + what);
}

// A caller's allocation must be large enough and live where load_options::device says.
void check_allocation(const buffer_view& v, std::uint64_t need, int device) {
  if (v.data == nullptr || v.nbytes < need) {
    invalid(fmt::format("the allocate callback returned {} bytes; the load needs {}", v.data == nullptr ? 0 : v.nbytes,
                        need));
  }
  const bool host = v.kind == memory_kind::host || v.kind == memory_kind::pinned;
  if (device < 0 ? !host : (v.kind != memory_kind::device || v.device != device)) {
    invalid(fmt::format("the allocate callback returned {} memory{}; the load asked for {}", to_string(v.kind),
                        v.device >= 0 ? fmt::format(" of device {}", v.device) : std::string(),
                        device < 0 ? std::string("host memory") : fmt::format("device {}", device)));
  }
}


bool ends_with(const std::string& s, std::string_view suffix) { return s.ends_with(suffix); }

// Where one selected tensor goes and which bytes of its file it needs.
struct item {
  const tensor_info* info = nullptr;
  slice_plan plan;
  std::uint64_t alloc_offset = 0;
};

// A run of contiguous (single-segment) items of one file, read with one request.
struct run {
  std::uint64_t file_begin = 0;
  std::uint64_t file_end = 0;
  std::uint64_t alloc_offset = 0;
  std::vector<item*> items;
};

// Copies host bytes into the destination at an offset (memcpy for host memory, a driver copy for the GPU).
using host_copier = std::function<void(const void* src, std::size_t nbytes, std::size_t dst_offset)>;

// Reads a multi-segment slice into `dst` (packed). Large segments are read directly; small ones through a
// staging buffer of at most `budget` bytes when a copier is given.
void read_strided(const file_handle& f, const tensor_info& t, const slice_plan& plan, buffer_view dst,
                  const host_copier& copy, std::size_t budget, load_stats& stats) {
  const std::uint64_t base = t.file_offset_bytes + plan.first_offset;
  if (plan.nbytes() == 0) return;
  const bool direct = plan.segment_bytes >= k_direct_segment_bytes || !copy || budget < plan.stride_bytes;
  if (direct) {
    for (std::uint64_t i = 0; i < plan.segments; ++i) {
      f.read_exact(dst.sub(i * plan.segment_bytes, plan.segment_bytes), plan.segment_bytes, base + i * plan.stride_bytes);
      stats.bytes_read += plan.segment_bytes;
      ++stats.read_requests;
    }
    return;
  }
  // Windows of whole segments: k segments span (k - 1) x stride + segment bytes.
  const std::uint64_t per_window = std::max<std::uint64_t>(1, (budget - plan.segment_bytes) / plan.stride_bytes + 1);
  const std::uint64_t window_cap = (std::min(per_window, plan.segments) - 1) * plan.stride_bytes + plan.segment_bytes;
  std::unique_ptr<std::byte[]> staging(new std::byte[window_cap]);
  for (std::uint64_t first = 0; first < plan.segments; first += per_window) {
    const std::uint64_t k = std::min(per_window, plan.segments - first);
    const std::uint64_t span = (k - 1) * plan.stride_bytes + plan.segment_bytes;
    f.read_exact(staging.get(), span, base + first * plan.stride_bytes);
    stats.bytes_read += span;
    ++stats.read_requests;
    for (std::uint64_t i = 0; i < k; ++i) {
      copy(staging.get() + i * plan.stride_bytes, plan.segment_bytes, (first + i) * plan.segment_bytes);
    }
  }
}

}  // namespace

struct model::storage_impl {
  struct host_free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{k_host_alignment}); }
  };
  // The loader's own memory (host or GPU), or only a view of the caller's.
  struct allocation {
    std::unique_ptr<std::byte[], host_free> host;
    device_buffer device;
    buffer_view view;
  };
  std::vector<allocation> allocations;  // in file order, one per shard with selected tensors
};

model::model() noexcept = default;
model::~model() = default;
model::model(model&&) noexcept = default;
model& model::operator=(model&&) noexcept = default;

const loaded_tensor* model::find(std::string_view name) const noexcept {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

buffer_view model::storage() const noexcept {
  return storage_ && !storage_->allocations.empty() ? storage_->allocations.front().view : buffer_view{};
}

std::vector<buffer_view> model::allocations() const {
  std::vector<buffer_view> out;
  if (storage_) {
    for (const auto& a : storage_->allocations) out.push_back(a.view);
  }
  return out;
}

std::vector<std::uint8_t> model::to_host(const loaded_tensor& t) const {
  std::vector<std::uint8_t> out(t.data.nbytes);
  if (out.empty()) return out;
  copy_out(t.data, 0, out.data(), out.size());
  return out;
}

std::string model::sha256_hex(const loaded_tensor& t) const {
  if (t.data.kind != memory_kind::device) return formats::sha256::hex(t.data.data, t.data.nbytes);
  auto bytes = to_host(t);
  return formats::sha256::hex(bytes.data(), bytes.size());
}

std::vector<shard> resolve_shards(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  // An index by name is read as one, even when it is not a file (EISDIR then, naming it).
  if (ends_with(path.filename().string(), ".index.json")) return formats::read_index(path);
  std::error_code ec;
  const bool folder = fs::is_directory(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw error(ec, "stat", path.string(), -1, 0);
  if (folder) {
    const fs::path preferred = path / "model.safetensors.index.json";
    if (fs::exists(fs::symlink_status(preferred, ec))) return formats::read_index(preferred);
    std::vector<fs::path> indexes, files;
    fs::directory_iterator it(path, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const auto name = it->path().filename().string();
      std::error_code type_ec;
      if (!it->is_regular_file(type_ec)) continue;
      if (ends_with(name, ".safetensors.index.json")) indexes.push_back(it->path());
      if (ends_with(name, ".safetensors")) files.push_back(it->path());
    }
    if (ec) throw error(ec, "read folder", path.string(), -1, 0);
    std::sort(indexes.begin(), indexes.end());
    if (indexes.size() > 1) {
      // Two indexes (say fp16 and fp32 variants) name different shards: loading every file would mix them.
      throw error(errno_code(EINVAL), "safetensors load", path.string(), -1, 0,
                  fmt::format("the folder has {} index files ({}, {}{}): name the one to load", indexes.size(),
                              printable_name(indexes[0].filename().string()),
                              printable_name(indexes[1].filename().string()),
                              indexes.size() > 2 ? ", ..." : ""));
    }
    if (indexes.size() == 1) return formats::read_index(indexes.front());
    if (files.empty()) {
      throw error(errno_code(ENOENT), "safetensors load", path.string(), -1, 0,
                  "no *.safetensors or model.safetensors.index.json in this folder");
    }
    std::sort(files.begin(), files.end());
    std::vector<shard> out;
    for (auto& f : files) out.push_back({f, {}});
    return out;
  }
  return {shard{path, {}}};
}

namespace {

using steady_clock = std::chrono::steady_clock;

// Which tensors the load takes, decided shard by shard as each header arrives. A name taken from an earlier
// shard is refused before any of the later shard's tensors are allocated or read.
class selection {
 public:
  explicit selection(const std::vector<std::string>& only) : only_(only), used_(only.size(), false) {}

  // The tensors of `h` to load: those the index assigns to the shard (every tensor without an index) that the
  // `only` entries take. Throws EBADMSG when the index names a tensor the header lacks, or for a name that an
  // earlier shard already gave.
  std::vector<const tensor_info*> choose(const shard& s, const header& h) {
    std::vector<const tensor_info*> listed;
    if (s.names.empty()) {
      for (const auto& t : h.tensors) listed.push_back(&t);
    } else {
      // header::find is a linear scan; an index names every tensor, so look names up through a map.
      std::unordered_map<std::string_view, const tensor_info*> by_name;
      by_name.reserve(h.tensors.size());
      for (const auto& t : h.tensors) by_name.emplace(t.name, &t);
      for (const auto& name : s.names) {
        const auto found = by_name.find(name);
        if (found == by_name.end()) {
          throw error(
              errno_code(EBADMSG), "safetensors index", s.file.string(), -1, 0,
              fmt::format("the index assigns \"{}\" to this file but its header lacks it", printable_name(name)));
        }
        listed.push_back(found->second);
      }
    }
    std::vector<const tensor_info*> chosen;
    for (const auto* t : listed) {
      if (!wanted(t->name)) continue;
      if (!seen_.insert(t->name).second) {
        throw error(errno_code(EBADMSG), "safetensors load", s.file.string(), -1, 0,
                    fmt::format("tensor \"{}\" appears in more than one file", printable_name(t->name)));
      }
      chosen.push_back(t);
    }
    return chosen;
  }

  // Throws EINVAL for an `only` entry that matched no tensor of any shard.
  void check_every_entry_matched(const std::filesystem::path& path) const {
    for (std::size_t i = 0; i < only_.size(); ++i) {
      if (!used_[i]) {
        invalid(fmt::format("no tensor matches \"{}\" in {}", printable_name(only_[i]), printable_name(path.string())));
      }
    }
  }

 private:
  bool wanted(const std::string& name) {
    if (only_.empty()) return true;
    bool any = false;
    for (std::size_t i = 0; i < only_.size(); ++i) {
      if (name_matches(only_[i], name)) any = used_[i] = true;
    }
    return any;
  }

  const std::vector<std::string>& only_;
  std::vector<bool> used_;
  std::set<std::string> seen_;
};

// One shard as the load streams it: its file and header, the tensors taken from it, and its allocation.
struct shard_load {
  file_handle file;
  header head;
  std::vector<item> items;
  std::vector<run> runs;
  std::vector<item*> strided;
  std::uint64_t nbytes = 0;  // what its allocation must hold
  buffer_view view;
};

// The alignment a piece of `nbytes` gets in the allocation: a power of two no larger than the piece (so the
// padding never exceeds the bytes it places: a file cannot make the allocation grow beyond about three times the
// bytes selected, however it scatters them), at least as large as any element in it (elements are powers of
// two no larger than the piece), at most `cap`.
std::uint64_t placement_alignment(std::uint64_t nbytes, std::uint64_t cap) {
  return std::min<std::uint64_t>(cap, std::bit_floor(std::max<std::uint64_t>(nbytes, 1)));
}

// Contiguous items merge into runs; each run starts at an address congruent to its file offset modulo 4 KiB
// (modulo the run's own size rounded down to a power of two for runs under 4 KiB, which O_DIRECT does not read
// into place anyway), so the O_DIRECT engine can read the aligned middle straight into place and every element
// is as aligned in memory as in the file. Strided slices follow the runs.
void lay_out(shard_load& s, std::uint64_t coalesce_gap_bytes) {
  std::sort(s.items.begin(), s.items.end(), [](const item& a, const item& b) {
    return a.info->file_offset_bytes + a.plan.first_offset < b.info->file_offset_bytes + b.plan.first_offset;
  });
  for (auto& it : s.items) {
    if (it.plan.segments > 1) {
      s.strided.push_back(&it);
      continue;
    }
    const std::uint64_t b = it.info->file_offset_bytes + it.plan.first_offset;
    const std::uint64_t e = b + it.plan.segment_bytes;
    if (!s.runs.empty() && b >= s.runs.back().file_end && b - s.runs.back().file_end <= coalesce_gap_bytes) {
      s.runs.back().file_end = std::max(s.runs.back().file_end, e);
    } else if (!s.runs.empty() && b < s.runs.back().file_end) {
      s.runs.back().file_end = std::max(s.runs.back().file_end, e);  // empty tensors sitting inside a run
    } else {
      s.runs.push_back({b, e, 0, {}});
    }
    s.runs.back().items.push_back(&it);
  }
  std::uint64_t cursor = 0;
  for (auto& r : s.runs) {
    const std::uint64_t a = placement_alignment(r.file_end - r.file_begin, k_host_alignment);
    r.alloc_offset = align_up(cursor, a) + r.file_begin % a;
    for (auto* it : r.items) {
      it->alloc_offset = r.alloc_offset + (it->info->file_offset_bytes + it->plan.first_offset - r.file_begin);
    }
    cursor = r.alloc_offset + (r.file_end - r.file_begin);
  }
  for (auto* it : s.strided) {
    it->alloc_offset = align_up(cursor, placement_alignment(it->plan.nbytes(), 256));
    cursor = it->alloc_offset + it->plan.nbytes();
  }
  s.nbytes = std::max<std::uint64_t>(cursor, 1);
}

// Opens a shard, reads and checks its header, selects its tensors and lays them out. Throws what open_file,
// read_header, plan_slice and selection::choose throw.
void prepare(shard_load& s, const shard& sh, const load_options& options, selection& select) {
  s.file = open_file(sh.file, options.config);
  s.head = read_header(s.file);
  for (const auto* t : select.choose(sh, s.head)) s.items.push_back({t, plan_slice(*t, options.slice), 0});
  lay_out(s, options.coalesce_gap_bytes);
}

// A piece of a run: `nbytes` at `file_offset` of `file` into `dst`.
struct segment {
  const file_handle* file = nullptr;
  std::uint64_t file_offset = 0;
  std::size_t nbytes = 0;
  buffer_view dst;
};

// The runs of a shard cut into segments that end at absolute multiples of `seg_bytes`, so each keeps its run's
// congruence of memory and file offset modulo 4 KiB and the O_DIRECT engine still reads straight into place.
std::vector<segment> cut_segments(const shard_load& s, std::size_t seg_bytes, load_stats& stats) {
  std::vector<segment> segs;
  for (const auto& r : s.runs) {
    if (r.file_end == r.file_begin) continue;
    for (std::uint64_t pos = r.file_begin; pos < r.file_end;) {
      const std::uint64_t stop = std::min<std::uint64_t>(r.file_end, pos / seg_bytes * seg_bytes + seg_bytes);
      const auto n = static_cast<std::size_t>(stop - pos);
      segs.push_back({&s.file, pos, n, s.view.sub(r.alloc_offset + (pos - r.file_begin), n)});
      pos = stop;
    }
    stats.bytes_read += r.file_end - r.file_begin;
    ++stats.read_requests;
  }
  stats.segments += segs.size();
  return segs;
}

// The shards' segments, read through the transfer core: each shard's segments are one batch, submitted as soon
// as its header is parsed and its memory allocated, at most `depth` segments reading at once. The next shard's
// batch goes out once the one before it has at most one segment left, so the device's queue does not drain at a
// file boundary (at most `depth` + 1 segments read at once), while this thread parses and allocates the shard
// after it: header work overlaps reads. The first error (lowest segment) wins, and once a batch failed the one
// after it is cancelled and nothing more is read. Destruction cancels the batches in flight and waits until they
// have let go of the files and the memory, whatever ends the load.
class segment_batches {
 public:
  explicit segment_batches(unsigned depth) : depth_(std::max(depth, 1u)) {}
  ~segment_batches() { cancel(); }
  segment_batches(const segment_batches&) = delete;
  segment_batches& operator=(const segment_batches&) = delete;

  // Submits a shard's segments (once the batch before it has at most one segment left); dropped once a read
  // failed. The last shard's single segment, with nothing else reading, is read on this thread (through the same
  // core).
  void push(std::vector<segment> segs, bool last) {
    collect(older_);
    if (current_.future.valid()) {
      current_.future.wait_pending_at_most(last && segs.size() == 1 ? 0 : 1);
      older_ = std::move(current_);
      current_ = {};
      if (older_.future.ready()) collect(older_);
    }
    if (error_ || segs.empty()) return;
    if (last && segs.size() == 1) {
      collect(older_);
      if (error_) return;
      if (!first_read_) first_read_ = steady_clock::now();
      peak_ = std::max(peak_, 1u);
      const segment& sg = segs.front();
      try {
        sg.file->read_exact(sg.dst, sg.nbytes, sg.file_offset);
      } catch (...) {
        error_ = std::current_exception();
      }
      idle_since_ = steady_clock::now();
      return;
    }
    std::vector<io_range> ranges;
    ranges.reserve(segs.size());
    for (const auto& sg : segs) ranges.push_back({sg.file, sg.file_offset, sg.dst.sub(0, sg.nbytes)});
    batch_options o;
    o.queue_depth = depth_;
    o.exact = true;
    if (!first_read_) first_read_ = steady_clock::now();
    current_.submitted = steady_clock::now();
    current_.future = submit(io_direction::read, ranges, o);
    current_.segs = std::move(segs);
    const unsigned tail = older_.future.valid() && !older_.future.ready() ? 1 : 0;
    peak_ = std::max(peak_, static_cast<unsigned>(std::min<std::size_t>(depth_, current_.segs.size())) + tail);
  }

  // Whether a batch is reading.
  bool busy() const { return reading(older_) || reading(current_); }

  // Now while a batch reads, else when the last one completed.
  steady_clock::time_point idle_since() const {
    if (busy()) return steady_clock::now();
    steady_clock::time_point t = idle_since_;
    for (const flight* f : {&older_, &current_}) {
      if (f->future.valid()) t = std::max(t, completed_at(*f, f->future.get()));
    }
    return t;
  }

  // Waits for the batches in flight; returns the first error, or null.
  std::exception_ptr finish() {
    collect(older_);
    collect(current_);
    return error_;
  }

  // Stops the batches in flight (their unread segments are cancelled) and waits until they have let go.
  void cancel() noexcept {
    for (flight* f : {&older_, &current_}) {
      if (f->future.valid()) f->future.cancel();
    }
    for (flight* f : {&older_, &current_}) {
      if (f->future.valid()) f->future.wait_released();
      *f = {};
    }
  }

  std::optional<steady_clock::time_point> first_read() const { return first_read_; }
  unsigned peak_in_flight() const { return peak_; }

 private:
  struct flight {
    batch_future future;
    std::vector<segment> segs;
    steady_clock::time_point submitted{};
  };

  static bool reading(const flight& f) { return f.future.valid() && !f.future.ready(); }

  // Waits for a batch and keeps its first failure (older batches are collected first, so the lowest segment's
  // error wins); a failure cancels the batch after it.
  void collect(flight& f) {
    if (!f.future.valid()) return;
    const batch_result& r = f.future.get();
    f.future.wait_released();
    idle_since_ = std::max(idle_since_, completed_at(f, r));
    for (std::size_t k = 0; k < r.ranges.size() && !error_; ++k) {
      const range_result& x = r.ranges[k];
      if (x.ok()) continue;
      const segment& sg = f.segs[k];
      const std::string path = sg.file->path().string();
      try {
        if (x.error == errno_code(ENODATA)) {
          throw short_read_error(path, static_cast<std::int64_t>(sg.file_offset), sg.nbytes, x.nbytes);
        }
        throw error(x.error, "pread", path, static_cast<std::int64_t>(sg.file_offset), sg.nbytes);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    f = {};
    if (error_ && current_.future.valid()) current_.future.cancel();  // nothing more is read
  }

  static steady_clock::time_point completed_at(const flight& f, const batch_result& r) {
    return f.submitted + std::chrono::duration_cast<steady_clock::duration>(std::chrono::duration<double>(r.seconds));
  }

  const unsigned depth_;
  flight older_;    // the shard before, finishing its last segment
  flight current_;  // the newest shard's batch
  steady_clock::time_point idle_since_{};
  std::optional<steady_clock::time_point> first_read_;
  std::exception_ptr error_;
  unsigned peak_ = 0;
};

// A new allocation of the model of `nbytes` on options.device: the caller's (checked) or the loader's own.
buffer_view allocate(model::storage_impl& st, std::uint64_t nbytes, const load_options& options) {
  model::storage_impl::allocation a;
  if (options.allocate) {
    a.view = options.allocate(nbytes);
    check_allocation(a.view, nbytes, options.device);
  } else if (options.device < 0) {
    a.host.reset(static_cast<std::byte*>(::operator new[](nbytes, std::align_val_t{k_host_alignment})));
    a.view = buffer_view::host(a.host.get(), nbytes);
  } else {
    a.device = device_buffer(nbytes, options.device);
    a.view = a.device.view();
  }
  st.allocations.push_back(std::move(a));
  return st.allocations.back().view;
}

}  // namespace

model load(const std::filesystem::path& path, const load_options& options) {
  const auto t_start = steady_clock::now();
  // Before any file or allocation: a framework's allocate callback would fail with an error of its own.
  if (std::string why; options.device >= 0 && !gpu_available(&why)) {
    throw error(errno_code(ENODEV), "safetensors load", path.string(), -1, 0,
                fmt::format("cuda:{}: no usable GPU: {}", options.device, why));
  }
  const auto shards = resolve_shards(path);
  std::vector<shard_load> loads(shards.size());
  selection select(options.only);
  model m;
  m.storage_ = std::make_shared<model::storage_impl>();
  load_stats stats;
  stats.files = shards.size();
  stats.header_seconds = seconds_since(t_start);
  const std::size_t seg_bytes =
      std::max<std::size_t>(options.pipeline_segment_bytes / k_host_alignment * k_host_alignment, k_host_alignment);
  // Declared after the files and the memory it reads into, so that on every way out it is destroyed first:
  // its reads drain before either goes.
  segment_batches pipeline(options.pipeline_depth);
  // Only this thread queues segments, so during a step of its own the reads can run dry but not resume: the
  // step overlapped them from its start until they ran dry.
  auto account = [&](steady_clock::time_point t0, bool busy, double& total) {
    const auto t1 = steady_clock::now();
    total += std::chrono::duration<double>(t1 - t0).count();
    if (busy) {
      stats.overlapped_seconds += std::chrono::duration<double>(std::min(t1, pipeline.idle_since()) - t0).count();
    }
  };

  // Shard by shard: the header, the selection and the layout, then the allocation (on this thread, where the
  // caller's allocate callback expects to run), then its segments join the pipeline while the next header is
  // read. A malformed header, an index naming a tensor its shard lacks or a name taken twice throws from here:
  // the pipeline's destructor drains the earlier shards' reads. After a failure the remaining headers are
  // still checked and, after a failed read, memory still allocated, so that the error reported does not depend
  // on timing and comes in the order a load that parsed and allocated before reading gave: headers, `only`,
  // allocation, reads. Nothing more is read.
  std::exception_ptr alloc_error;
  for (std::size_t fi = 0; fi < shards.size(); ++fi) {
    auto& s = loads[fi];
    auto t0 = steady_clock::now();
    bool busy = pipeline.busy();
    prepare(s, shards[fi], options, select);
    account(t0, busy, stats.header_seconds);
    if (s.items.empty() || alloc_error) continue;
    t0 = steady_clock::now();
    busy = pipeline.busy();
    try {
      s.view = allocate(*m.storage_, s.nbytes, options);
      if (m.storage_->allocations.size() == 1) stats.path = s.file.plan(s.view);
      pipeline.push(cut_segments(s, seg_bytes, stats), fi + 1 == shards.size());
    } catch (...) {
      alloc_error = std::current_exception();
      pipeline.cancel();
    }
    account(t0, busy, stats.alloc_seconds);
  }
  select.check_every_entry_matched(path);
  if (alloc_error) std::rethrow_exception(alloc_error);
  if (m.storage_->allocations.empty()) {
    // Nothing selected: one byte, so that a load always has an allocation (the caller's callback runs once).
    const auto t0 = steady_clock::now();
    const buffer_view v = allocate(*m.storage_, 1, options);
    stats.alloc_seconds += seconds_since(t0);
    if (!loads.empty()) stats.path = loads.front().file.plan(v);
  }
  if (auto e = pipeline.finish()) std::rethrow_exception(e);

  // Strided slices, one at a time so that one staging buffer bounds the host memory they use.
  std::optional<steady_clock::time_point> first_read = pipeline.first_read();
  for (auto& s : loads) {
    for (auto* it : s.strided) {
      if (!first_read) first_read = steady_clock::now();
      const buffer_view view = s.view;
      auto copy = [view, base = it->alloc_offset](const void* src, std::size_t n, std::size_t off) {
        copy_into(view, base + off, src, n);
      };
      read_strided(s.file, *it->info, it->plan, view.sub(it->alloc_offset, it->plan.nbytes()), copy,
                   options.staging_budget_bytes, stats);
    }
  }
  if (first_read) {
    stats.first_read_seconds = std::chrono::duration<double>(*first_read - t_start).count();
    stats.seconds = seconds_since(*first_read);
  }
  stats.peak_segments_in_flight = pipeline.peak_in_flight();
  stats.allocations = m.storage_->allocations.size();

  // Report tensors in file order (shard by shard), as the headers list them by offset.
  for (std::size_t fi = 0; fi < loads.size(); ++fi) {
    std::vector<const item*> order;
    for (const auto& it : loads[fi].items) order.push_back(&it);
    std::sort(order.begin(), order.end(), [](const item* a, const item* b) {
      return a->info->begin_bytes != b->info->begin_bytes ? a->info->begin_bytes < b->info->begin_bytes
                                                          : a->info->name < b->info->name;
    });
    for (const auto* it : order) {
      loaded_tensor t;
      t.name = it->info->name;
      t.dtype = it->info->dtype;
      t.shape = it->plan.shape;
      t.full_shape = it->info->shape;
      t.data = loads[fi].view.sub(it->alloc_offset, it->plan.nbytes());
      t.file = shards[fi].file;
      stats.tensor_bytes += it->plan.nbytes();
      m.tensors_.push_back(std::move(t));
    }
  }
  if (!loads.empty()) m.metadata_ = loads.front().head.metadata;
  m.stats_ = std::move(stats);
  return m;
}

load_stats load_into(const std::filesystem::path& path, const std::map<std::string, buffer_view>& destinations,
                     const load_options& options) {
  const file_handle f = open_file(path, options.config);
  const auto t_headers = std::chrono::steady_clock::now();
  const auto h = read_header(f);
  load_stats stats;
  stats.files = 1;
  stats.header_seconds = seconds_since(t_headers);
  std::vector<std::pair<const tensor_info*, slice_plan>> work;
  for (const auto& [name, dst] : destinations) {
    const auto* t = h.find(name);
    if (t == nullptr) invalid(fmt::format("{} has no tensor \"{}\"", printable_name(path.string()), printable_name(name)));
    auto plan = plan_slice(*t, options.slice);
    if (dst.nbytes < plan.nbytes()) {
      invalid(fmt::format("destination of \"{}\" holds {} bytes; the tensor needs {}", printable_name(name), dst.nbytes,
                          plan.nbytes()));
    }
    work.emplace_back(t, std::move(plan));
  }
  if (!destinations.empty()) stats.path = f.plan(destinations.begin()->second);
  const auto t_read = std::chrono::steady_clock::now();
  for (const auto& [t, plan] : work) {
    const buffer_view dst = destinations.at(t->name);
    if (plan.segments == 1) {
      if (plan.segment_bytes > 0) {
        f.read_exact(dst.sub(0, plan.segment_bytes), plan.segment_bytes, t->file_offset_bytes + plan.first_offset);
        stats.bytes_read += plan.segment_bytes;
        ++stats.read_requests;
      }
    } else {
      host_copier copy;
      if (dst.kind != memory_kind::device) {
        copy = [d = static_cast<std::byte*>(dst.data)](const void* src, std::size_t n, std::size_t off) {
          std::memcpy(d + off, src, n);
        };
      }
      read_strided(f, *t, plan, dst, copy, options.staging_budget_bytes, stats);
    }
    stats.tensor_bytes += plan.nbytes();
  }
  stats.seconds = seconds_since(t_read);
  return stats;
}

}  // namespace gdskit::safetensors
