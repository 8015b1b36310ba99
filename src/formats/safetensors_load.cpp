// Loading safetensors files and sharded checkpoints into host or GPU memory.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <atomic>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>

#include "formats/safetensors_open.hpp"
#include "formats/sha256.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "engine/thread_pool.hpp"

namespace gdskit::safetensors {

namespace {

constexpr std::size_t k_host_alignment = 4096;
// Strided segments at least this large are read one by one straight into their destination; smaller ones are
// gathered through the staging buffer, since many tiny requests cost more than the bytes skipped between them.
constexpr std::uint64_t k_direct_segment_bytes = std::uint64_t{256} << 10;

[[noreturn]] void invalid(const std::string& what) { 
  throw error(errno_code(EINVAL), "safetensors load: " + what);
}
[[noreturn]] void bad_index(const std::filesystem::path& p, const std::string& what) {
  throw error(errno_code(EBADMSG), "safetensors index", p.string(), -1, 0, what);
}

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool matches(const std::string& entry, const std::string& name) {
  if (entry.empty()) return false;
  if (entry.back() == '*') return name.starts_with(std::string_view(entry).substr(0, entry.size() - 1));
  if (entry.back() == '.') return name.starts_with(entry);
  return name == entry;
}

bool ends_with(const std::string& s, std::string_view suffix) { return s.ends_with(suffix); }

std::vector<shard> read_index(const std::filesystem::path& index) {
  const std::string text = formats::read_small_file(index, max_header_bytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_index(index, fmt::format("invalid JSON: {}", e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    bad_index(index, "no \"weight_map\" object");
  }
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) bad_index(index, fmt::format("weight_map entry \"{}\" is not a string", it.key()));
    std::filesystem::path rel(it.value().get<std::string>());
    if (rel.empty() || rel.is_absolute()) {
      bad_index(index, fmt::format("weight_map entry \"{}\" names no relative file", it.key()));
    }
    for (const auto& part : rel) {
      if (part == "..") bad_index(index, fmt::format("weight_map entry \"{}\" leaves the folder", it.key()));
    }
    by_file[rel.string()].push_back(it.key());
  }
  if (by_file.empty()) bad_index(index, "weight_map is empty");
  std::vector<shard> out;
  for (auto& [file, names] : by_file) out.push_back({index.parent_path() / file, std::move(names)});
  return out;
}

// Where one selected tensor goes and which bytes of the file it needs.
struct item {
  const tensor_info* info = nullptr;
  std::size_t file_index = 0;
  slice_plan plan;
  std::uint64_t alloc_offset = 0;
};

// A run of contiguous (single-segment) items of one file, read with one request.
struct run {
  std::size_t file_index = 0;
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
  std::unique_ptr<std::byte[], host_free> host;
  device_buffer device;
  buffer_view view;
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

buffer_view model::storage() const noexcept { return storage_ ? storage_->view : buffer_view{}; }

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
  if (ends_with(path.filename().string(), ".index.json")) return read_index(path);
  std::error_code ec;
  const bool folder = fs::is_directory(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw error(ec, "stat", path.string(), -1, 0);
  if (folder) {
    const fs::path preferred = path / "model.safetensors.index.json";
    if (fs::exists(fs::symlink_status(preferred, ec))) return read_index(preferred);
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
                              indexes[0].filename().string(), indexes[1].filename().string(),
                              indexes.size() > 2 ? ", ..." : ""));
    }
    if (indexes.size() == 1) return read_index(indexes.front());
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

struct segment {
  std::size_t file_index;
  std::uint64_t file_offset;
  std::uint64_t nbytes;
  std::uint64_t alloc_offset;
};

// The runs of every shard as one stream of segments, `pipeline_depth` of them reading at once: while one
// segment's last requests drain, the next one's (in the same file or the next) are already issued. Segments
// end at absolute multiples of the segment size, so each keeps its run's congruence of memory and file offset
// modulo 4 KiB and the O_DIRECT engine still reads straight into place. The first error (lowest segment)
// wins and stops the rest.
void read_pipelined(const std::vector<file_handle>& files, const std::vector<run>& runs, buffer_view view,
                    const load_options& options, load_stats& stats) {
  const std::size_t seg_bytes =
      std::max<std::size_t>(options.pipeline_segment_bytes / k_host_alignment * k_host_alignment, k_host_alignment);
  std::vector<segment> segs;
  for (const auto& r : runs) {
    if (r.file_end == r.file_begin) continue;
    for (std::uint64_t pos = r.file_begin; pos < r.file_end;) {
      const std::uint64_t stop = std::min<std::uint64_t>(r.file_end, pos / seg_bytes * seg_bytes + seg_bytes);
      segs.push_back({r.file_index, pos, stop - pos, r.alloc_offset + (pos - r.file_begin)});
      pos = stop;
    }
    stats.bytes_read += r.file_end - r.file_begin;
    ++stats.read_requests;
  }
  stats.segments = segs.size();
  const unsigned depth = static_cast<unsigned>(std::clamp<std::size_t>(options.pipeline_depth, 1, std::max<std::size_t>(segs.size(), 1)));
  std::atomic<std::size_t> next{0};
  std::atomic<unsigned> in_flight{0};
  std::atomic<unsigned> peak{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr first;
  std::size_t first_index = SIZE_MAX;
  engine::parallel_for(depth, depth, [&](std::size_t) {
    for (std::size_t i = next++; i < segs.size() && !failed.load(); i = next++) {
      const segment& sg = segs[i];
      const unsigned now = ++in_flight;
      for (unsigned p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
      }
      try {
        files[sg.file_index].read_exact(view.sub(sg.alloc_offset, sg.nbytes), sg.nbytes, sg.file_offset);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (i < first_index) {
          first = std::current_exception();
          first_index = i;
        }
        failed = true;
      }
      --in_flight;
    }
  });
  stats.peak_segments_in_flight = peak.load();
  if (first) std::rethrow_exception(first);
}

}  // namespace

model load(const std::filesystem::path& path, const load_options& options) {
  const auto t_headers = std::chrono::steady_clock::now();
  const auto shards = resolve_shards(path);
  std::vector<file_handle> files;
  std::vector<header> headers;
  files.reserve(shards.size());
  headers.reserve(shards.size());
  for (const auto& s : shards) {
    files.push_back(open_file(s.file, options.config));
    headers.push_back(read_header(files.back()));
  }

  // Select tensors: the index's names per shard, filtered by `only`.
  std::vector<item> items;
  std::set<std::string> seen;
  std::vector<bool> only_used(options.only.size(), false);
  auto wanted = [&](const std::string& name) {
    if (options.only.empty()) return true;
    bool any = false;
    for (std::size_t i = 0; i < options.only.size(); ++i) {
      if (matches(options.only[i], name)) any = only_used[i] = true;
    }
    return any;
  };
  for (std::size_t fi = 0; fi < shards.size(); ++fi) {
    const auto& h = headers[fi];
    std::vector<const tensor_info*> chosen;
    if (shards[fi].names.empty()) {
      for (const auto& t : h.tensors) chosen.push_back(&t);
    } else {
      // header::find is a linear scan; an index names every tensor, so look names up through a map.
      std::unordered_map<std::string_view, const tensor_info*> by_name;
      by_name.reserve(h.tensors.size());
      for (const auto& t : h.tensors) by_name.emplace(t.name, &t);
      for (const auto& name : shards[fi].names) {
        const auto found = by_name.find(name);
        const tensor_info* t = found == by_name.end() ? nullptr : found->second;
        if (t == nullptr) {
          throw error(errno_code(EBADMSG), "safetensors index", shards[fi].file.string(), -1, 0,
                      fmt::format("the index assigns \"{}\" to this file but its header lacks it", printable_name(name)));
        }
        chosen.push_back(t);
      }
    }
    for (const auto* t : chosen) {
      if (!wanted(t->name)) continue;
      if (!seen.insert(t->name).second) {
        throw error(errno_code(EBADMSG), "safetensors load", shards[fi].file.string(), -1, 0,
                    fmt::format("tensor \"{}\" appears in more than one file", printable_name(t->name)));
      }
      items.push_back({t, fi, plan_slice(*t, options.slice), 0});
    }
  }
  for (std::size_t i = 0; i < options.only.size(); ++i) {
    if (!only_used[i]) invalid(fmt::format("no tensor matches \"{}\" in {}", options.only[i], path.string()));
  }
  const double header_seconds = seconds_since(t_headers);

  // Layout: contiguous items of one file merge into runs; each run starts at an address congruent to its file
  // offset modulo 4 KiB, so the O_DIRECT engine can read the aligned middle straight into place.
  std::sort(items.begin(), items.end(), [](const item& a, const item& b) {
    if (a.file_index != b.file_index) return a.file_index < b.file_index;
    return a.info->file_offset_bytes + a.plan.first_offset < b.info->file_offset_bytes + b.plan.first_offset;
  });
  std::vector<run> runs;
  std::vector<item*> strided;
  std::uint64_t cursor = 0;
  for (auto& it : items) {
    if (it.plan.segments > 1) {
      strided.push_back(&it);
      continue;
    }
    const std::uint64_t b = it.info->file_offset_bytes + it.plan.first_offset;
    const std::uint64_t e = b + it.plan.segment_bytes;
    if (!runs.empty() && runs.back().file_index == it.file_index && b >= runs.back().file_end &&
        b - runs.back().file_end <= options.coalesce_gap_bytes) {
      runs.back().file_end = std::max(runs.back().file_end, e);
    } else if (!runs.empty() && runs.back().file_index == it.file_index && b < runs.back().file_end) {
      runs.back().file_end = std::max(runs.back().file_end, e);  // empty tensors sitting inside a run
    } else {
      runs.push_back({it.file_index, b, e, 0, {}});
    }
    runs.back().items.push_back(&it);
  }
  for (auto& r : runs) {
    r.alloc_offset = align_up(cursor, k_host_alignment) + r.file_begin % k_host_alignment;
    for (auto* it : r.items) {
      it->alloc_offset = r.alloc_offset + (it->info->file_offset_bytes + it->plan.first_offset - r.file_begin);
    }
    cursor = r.alloc_offset + (r.file_end - r.file_begin);
  }
  for (auto* it : strided) {
    it->alloc_offset = align_up(cursor, 256);
    cursor = it->alloc_offset + it->plan.nbytes();
  }
  const std::uint64_t total = std::max<std::uint64_t>(cursor, 1);

  model m;
  m.storage_ = std::make_shared<model::storage_impl>();
  auto& st = *m.storage_;
  const auto t_alloc = std::chrono::steady_clock::now();
  if (options.allocate) {
    st.view = options.allocate(total);
    check_allocation(st.view, total, options.device);
  } else if (options.device < 0) {
    st.host.reset(static_cast<std::byte*>(::operator new[](total, std::align_val_t{k_host_alignment})));
    st.view = buffer_view::host(st.host.get(), total);
  } else {
    st.device = device_buffer(total, options.device);
    st.view = st.device.view();
  }
  load_stats stats;
  stats.alloc_seconds = seconds_since(t_alloc);
  stats.files = shards.size();
  stats.header_seconds = header_seconds;
  if (!files.empty()) stats.path = files.front().plan(st.view);
  host_copier copy = [&st](const void* src, std::size_t n, std::size_t off) { copy_into(st.view, off, src, n); };

  const auto t_read = std::chrono::steady_clock::now();
  read_pipelined(files, runs, st.view, options, stats);
  for (auto* it : strided) {
    auto with_offset = [&, base = it->alloc_offset](const void* src, std::size_t n, std::size_t off) {
      copy(src, n, base + off);
    };
    read_strided(files[it->file_index], *it->info, it->plan, st.view.sub(it->alloc_offset, it->plan.nbytes()),
                 with_offset, options.staging_budget_bytes, stats);
  }
  stats.seconds = seconds_since(t_read);

  // Report tensors in file order (shard by shard), as the headers list them by offset.
  std::sort(items.begin(), items.end(), [](const item& a, const item& b) {
    if (a.file_index != b.file_index) return a.file_index < b.file_index;
    return a.info->begin_bytes != b.info->begin_bytes ? a.info->begin_bytes < b.info->begin_bytes
                                                      : a.info->name < b.info->name;
  });
  for (const auto& it : items) {
    loaded_tensor t;
    t.name = it.info->name;
    t.dtype = it.info->dtype;
    t.shape = it.plan.shape;
    t.full_shape = it.info->shape;
    t.data = st.view.sub(it.alloc_offset, it.plan.nbytes());
    t.file = shards[it.file_index].file;
    stats.tensor_bytes += it.plan.nbytes();
    m.tensors_.push_back(std::move(t));
  }
  if (!headers.empty()) m.metadata_ = headers.front().metadata;
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
    if (t == nullptr) invalid(fmt::format("{} has no tensor \"{}\"", path.string(), printable_name(name)));
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
