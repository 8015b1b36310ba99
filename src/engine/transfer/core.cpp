#include "engine/transfer/core.hpp"

#include <algorithm>
#include <atomic>

#include "engine/thread_pool.hpp"
#include "gdskit/error.hpp"

namespace gdskit::engine {

transfer_core& transfer_core::instance() {
  static transfer_core core;
  return core;
}

namespace {

bool host_memory(const buffer_view& b) { return b.kind == memory_kind::host || b.kind == memory_kind::pinned; }

// One range through the file's single-range path.
void run_range(detail::batch_state& b, std::size_t i) {
  const detail::batch_range& r = b.ranges[i];
  const std::size_t n = r.memory.nbytes;
  if (n == 0) {
    b.complete(i, 0, {});
    return;
  }
  std::size_t got = 0;
  std::error_code ec;
  try {
    const file_handle h = file_access::wrap(r.file);
    if (b.dir == io_direction::read) {
      got = h.read(r.memory, n, r.offset);
      if (got < n && b.options.exact) ec = errno_code(ENODATA);
    } else {
      got = h.write(r.memory, n, r.offset);
    }
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::bad_alloc&) {
    ec = errno_code(ENOMEM);
  }
  (host_memory(r.memory) ? b.routed_host : b.routed_staged).fetch_add(1, std::memory_order_relaxed);
  b.requests.fetch_add(1, std::memory_order_relaxed);
  b.complete(i, got, ec);
}

}  // namespace

void transfer_core::run(const std::shared_ptr<detail::batch_state>& batch) {
  struct cursor {
    std::atomic<std::size_t> next{0};
    std::atomic<unsigned> workers{0};
  };
  auto c = std::make_shared<cursor>();
  const std::size_t n = batch->ranges.size();
  const unsigned depth = batch->options.queue_depth != 0 ? batch->options.queue_depth : 16u;
  const unsigned workers = static_cast<unsigned>(std::min<std::size_t>(n, depth));
  c->workers = workers;
  auto& pool = shared_pool(workers);
  for (unsigned w = 0; w < workers; ++w) {
    pool.submit([batch, c] {
      for (;;) {
        const std::size_t i = c->next.fetch_add(1);
        if (i >= batch->ranges.size() || batch->stopping()) break;
        if (batch->decided(i)) continue;
        batch->hold();
        run_range(*batch, i);
        batch->release_hold();
      }
      // The last worker out gives back the submission hold: no request of the batch starts after this.
      if (c->workers.fetch_sub(1) == 1) batch->release_hold();
    });
  }
}

}  // namespace gdskit::engine
