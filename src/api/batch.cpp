// submit(): checks a batch's ranges before any I/O, then hands them to the transfer core.
#include <algorithm>
#include <limits>
#include <cerrno>

#include <fmt/format.h>

#include "api/file_access.hpp"
#include "api/routes.hpp"
#include "common/key_sort.hpp"
#include "engine/file_range.hpp"
#include "engine/transfer/batch_state.hpp"
#include "engine/thread_pool.hpp"
#include "engine/transfer/core.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"

namespace gdskit {

namespace {

// A checksummed range is moved whole through one staging slot (16 MiB at most, O_DIRECT cover included).
constexpr std::size_t k_max_checksummed_bytes = (std::size_t{16} << 20) - (std::size_t{64} << 10);

[[noreturn]] void bad_item(std::error_code ec, std::size_t i, const detail::batch_range* r, std::uint64_t offset,
                           std::size_t nbytes, const std::string& what) {
  // An offset past the largest file offset has no signed form: said in the text instead.
  const bool signed_offset = offset <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  throw error(ec, "batch", r != nullptr && r->file ? r->file->path.string() : std::string(),
              signed_offset ? static_cast<std::int64_t>(offset) : -1, nbytes,
              signed_offset ? fmt::format("item {}: {}", i, what) : fmt::format("item {} at offset {}: {}", i, offset, what));
}

// Every check that can be made before the first byte moves; throws naming the first bad item.
void check_ranges(io_direction dir, std::span<const io_range> in, const batch_options& options,
                  std::vector<detail::batch_range>& out) {
  const bool write = dir == io_direction::write;
  const char* op = write ? "pwrite" : "pread";
  int gpus = -1;  // counted at the first item in GPU memory
  auto need_gpu = [&](std::size_t i, const detail::batch_range* r, std::uint64_t off, std::size_t n, int device) {
    if (gpus < 0) {
      std::string reason;
      if (!gpu_available(&reason)) bad_item(errno_code(ENODEV), i, r, off, n, "GPU memory but no usable GPU: " + reason);
      gpus = gpu_count();
    }
    if (device >= gpus || (r != nullptr && r->memory.kind == memory_kind::device && device < 0)) {
      bad_item(errno_code(ENODEV), i, r, off, n,
               fmt::format("memory of GPU {}, but this process sees {} GPU(s)", device, gpus));
    }
  };
  for (std::size_t i = 0; i < in.size(); ++i) {
    const io_range& r = in[i];
    const std::size_t n = r.memory.nbytes;
    if (r.file == nullptr) bad_item(errno_code(EINVAL), i, nullptr, r.offset_bytes, n, "no file");
    detail::batch_range br{file_access::shared(*r.file), r.offset_bytes, r.memory, r.crc32c};
    if (!br.file) bad_item(errno_code(EBADF), i, nullptr, r.offset_bytes, n, "the file handle is not open");
    const engine::open_file& f = *br.file;
    if (write ? f.mode == open_mode::read : f.mode == open_mode::write) {
      bad_item(errno_code(EBADF), i, &br, r.offset_bytes, n,
               write ? "file opened for reading only" : "file opened for writing only");
    }
    try {
      engine::check_file_range(op, f.path.native(), write, r.offset_bytes, n);
    } catch (const error& e) {
      bad_item(e.code(), i, &br, r.offset_bytes, n, "the range ends past the largest file offset (2^63 - 1)");
    }
    if (n > 0 && r.memory.data == nullptr) bad_item(errno_code(EFAULT), i, &br, r.offset_bytes, n, "null memory");
    if (options.checksum != batch_checksum::none && n > k_max_checksummed_bytes) {
      bad_item(errno_code(EINVAL), i, &br, r.offset_bytes, n,
               fmt::format("a checksummed range is at most {} bytes", k_max_checksummed_bytes));
    }
    if (!engine::host_memory(r.memory)) need_gpu(i, &br, r.offset_bytes, n, r.memory.device);
    out.push_back(std::move(br));
  }
  if (options.stream != nullptr && !in.empty()) need_gpu(0, &out.front(), in.front().offset_bytes, 0, 0);

  // Neighbours in memory (reads) or in the file (writes) found by one linear-time sort: a comparison sort of a
  // batch of 65,536 ranges took milliseconds before the first byte moved.
  std::vector<key_value> order;
  order.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i].memory.nbytes == 0) continue;
    order.push_back({write ? in[i].offset_bytes : static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(in[i].memory.data)), i});
  }
  std::vector<key_value> scratch;
  auto overlap = [&](std::size_t p, std::size_t i, const std::string& what) {
    const std::size_t later = std::max(p, i);
    bad_item(errno_code(EINVAL), later, &out[later], in[later].offset_bytes, in[later].memory.nbytes,
             fmt::format(fmt::runtime(what), std::min(p, i)));
  };
  if (!write) {
    // Two reads into the same bytes would race: which one lands is not defined.
    stable_sort_by_key(order, scratch);
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::size_t p = order[k - 1].value, i = order[k].value;
      if (order[k].key < order[k - 1].key + in[p].memory.nbytes) {
        overlap(p, i, "its memory overlaps that of item {}: reads need distinct destinations");
      }
    }
  } else {
    // Two writes to the same bytes of a file would race the same way.
    stable_sort_by_group_and_key(order, scratch, [&](std::uint64_t i) -> const void* { return out[i].file.get(); });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::size_t p = order[k - 1].value, i = order[k].value;
      if (out[p].file == out[i].file && order[k].key < order[k - 1].key + in[p].memory.nbytes) {
        overlap(p, i, "it overlaps item {} in the file: writes need distinct file ranges");
      }
    }
  }
}

}  // namespace

batch_future submit(io_direction dir, std::span<const io_range> ranges, const batch_options& options) {
  detail::ensure_routes();
  auto state = std::make_shared<detail::batch_state>(dir, options, ranges.size());
  check_ranges(dir, ranges, options, state->ranges);
  if (ranges.empty()) return batch_future(std::move(state));
  engine::transfer_core& core = engine::transfer_core::instance();
  // Stream ordering is set up before anything can complete: a read's gate opens with the batch's completion,
  // a write starts when the stream gets to it.
  int stream_device = 0;
  for (const auto& r : ranges) {
    if (!engine::host_memory(r.memory)) {
      stream_device = r.memory.device < 0 ? 0 : r.memory.device;
      break;
    }
  }
  if (options.stream != nullptr && dir == io_direction::read) {
    state->on_ready = core.gpu().stream_gate(options.stream, stream_device);
  }
  state->attach_files();
  if (options.deadline) {
    if (*options.deadline <= std::chrono::steady_clock::now()) {
      state->complete_rest(errno_code(ETIMEDOUT));  // a deadline already past: nothing starts
    } else {
      detail::arm_deadline(state, *options.deadline);
    }
  }
  if (options.stream != nullptr && dir == io_direction::write) {
    // The stream's thread only hands the batch to the pool: no CUDA call may run there.
    try {
      core.gpu().when_stream_reaches(options.stream, stream_device, [state, &core] {
        engine::shared_pool(1).submit([state, &core] { core.run(state); });
      });
    } catch (...) {
      state->complete_rest(errno_code(ECANCELED));
      core.run(state);  // gives back the submission hold
      throw;
    }
    return batch_future(std::move(state));
  }
  core.run(state);
  return batch_future(std::move(state));
}

batch_result transfer(io_direction dir, std::span<const io_range> ranges, const batch_options& options) {
  batch_future f = submit(dir, ranges, options);
  batch_result r = f.get();
  f.wait_released();
  return r;
}

// ---- batch_future ----

namespace {
const detail::batch_state& need(const std::shared_ptr<detail::batch_state>& s) {
  if (!s) throw error(errno_code(EINVAL), "batch_future: empty (default-constructed or moved-from)");
  return *s;
}
}  // namespace

batch_future::batch_future() noexcept = default;
batch_future::batch_future(std::shared_ptr<detail::batch_state> state) noexcept : state_(std::move(state)) {}
batch_future::~batch_future() {
  if (state_) state_->wait_released();
}
batch_future::batch_future(batch_future&&) noexcept = default;
batch_future& batch_future::operator=(batch_future&& o) noexcept {
  if (this != &o) {
    if (state_) state_->wait_released();
    state_ = std::move(o.state_);
  }
  return *this;
}

bool batch_future::ready() const { return need(state_).ready(); }
void batch_future::wait() const { need(state_).wait_ready(); }
std::size_t batch_future::wait_pending_at_most(std::size_t n) const { return need(state_).wait_undecided_at_most(n); }
bool batch_future::wait_for(std::chrono::nanoseconds timeout) const {
  const detail::batch_state& s = need(state_);
  using clock = std::chrono::steady_clock;
  if (timeout <= std::chrono::nanoseconds::zero()) return s.ready();
  const clock::time_point now = clock::now();
  // A timeout past the clock's range (nanoseconds::max() for "forever") would overflow now + timeout into the
  // past: it waits without one.
  if (timeout >= clock::time_point::max() - now) {
    s.wait_ready();
    return true;
  }
  return s.wait_ready_until(now + std::chrono::duration_cast<clock::duration>(timeout));
}
int batch_future::fd() const { return need(state_).event_fd(); }
bool batch_future::cancel() const {
  need(state_);
  if (state_->ready()) return false;
  // Past its deadline a batch times out, whoever notices first.
  const auto& dl = state_->options.deadline;
  const bool late = dl && std::chrono::steady_clock::now() >= *dl;
  return state_->complete_rest(errno_code(late ? ETIMEDOUT : ECANCELED)) > 0;
}
const batch_result& batch_future::get() const {
  need(state_).wait_ready();
  return state_->result();
}
io_future::io_future(batch_future batch, std::string path, std::uint64_t offset_bytes, std::size_t nbytes, bool write)
    : batch_(std::move(batch)), path_(std::move(path)), offset_(offset_bytes), nbytes_(nbytes), write_(write) {}

std::size_t io_future::get() const {
  const batch_result& r = batch_.get();
  const range_result& one = r.ranges.at(0);
  if (one.error) {
    // The caller owns the memory again once the future returns or throws.
    batch_.wait_released();
    throw error(one.error, write_ ? "pwrite" : "pread", path_, static_cast<std::int64_t>(offset_), nbytes_);
  }
  return one.nbytes;
}

bool batch_future::released() const { return need(state_).released(); }
void batch_future::wait_released() const { need(state_).wait_released(); }
void batch_future::on_ready(std::function<void()> callback) const {
  if (!callback) throw error(errno_code(EINVAL), "batch_future::on_ready: an empty callback");
  need(state_);
  state_->add_callback(std::move(callback));
}

}  // namespace gdskit
