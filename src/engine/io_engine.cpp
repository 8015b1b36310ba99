#include "engine/io_engine.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "common/arith.hpp"
#include "engine/thread_pool.hpp"
#include "posix/syscalls.hpp"

#ifdef GDSKIT_HAVE_URING
#include <liburing.h>
#endif

namespace gdskit::engine {
namespace {

struct aligned_free {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using aligned_ptr = std::unique_ptr<std::byte, aligned_free>;

aligned_ptr aligned_alloc_bytes(std::size_t alignment, std::size_t nbytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, alignment, nbytes) != 0) throw std::bad_alloc();
  return aligned_ptr(static_cast<std::byte*>(p));
}

// One bounce buffer per thread, grown on demand.
std::byte* thread_bounce(std::size_t alignment, std::size_t nbytes) {
  thread_local aligned_ptr buf;
  thread_local std::size_t cap = 0;
  thread_local std::size_t cap_align = 0;
  if (nbytes > cap || alignment > cap_align) {
    buf = aligned_alloc_bytes(alignment, nbytes);
    cap = nbytes;
    cap_align = alignment;
  }
  return buf.get();
}


void run_bounce_read(io_task& t) {
  const std::uint64_t a0 = align_down(t.offset, t.alignment);
  const std::uint64_t a1 = align_up(t.offset + t.nbytes, t.alignment);
  std::byte* b = thread_bounce(t.alignment, a1 - a0);
  std::size_t got = posix::pread_full(t.fd, b, a1 - a0, a0, t.ec);
  if (t.ec) return;
  const std::size_t head = t.offset - a0;
  const std::size_t avail = got > head ? got - head : 0;
  t.done = std::min(avail, t.nbytes);
  std::memcpy(t.buf, b + head, t.done);
}

void run_bounce_write(io_task& t) {
  // The planner only bounces writes whose file range is aligned (partial blocks go through the buffered fd).
  std::byte* b = thread_bounce(t.alignment, t.nbytes);
  std::memcpy(b, t.buf, t.nbytes);
  t.done = posix::pwrite_full(t.fd, b, t.nbytes, t.offset, t.ec);
}

}  // namespace

void run_task(io_task& t) noexcept {
  t.done = 0;
  t.ec.clear();
  try {
    if (t.bounce) {
      t.write ? run_bounce_write(t) : run_bounce_read(t);
    } else if (t.write) {
      t.done = posix::pwrite_full(t.fd, t.buf, t.nbytes, t.offset, t.ec);
    } else {
      t.done = posix::pread_full(t.fd, t.buf, t.nbytes, t.offset, t.ec);
    }
  } catch (const std::bad_alloc&) {
    t.ec = std::make_error_code(std::errc::not_enough_memory);
  }
}

void run_threads(std::span<io_task> tasks, unsigned parallelism, const io_observer* obs) {
  parallel_for(tasks.size(), parallelism, [&](std::size_t i) {
    run_task(tasks[i]);
    if (obs != nullptr && tasks[i].direct && tasks[i].done > 0) obs->completed(tasks[i].done);
  });
}

#ifdef GDSKIT_HAVE_URING
namespace {

class ring {
 public:
  explicit ring(unsigned depth) : depth_(depth) {
    int r = io_uring_queue_init(depth, &ring_, 0);
    if (r < 0) throw std::system_error(-r, std::generic_category(), "io_uring_queue_init");
  }
  ~ring() { io_uring_queue_exit(&ring_); }
  ring(const ring&) = delete;
  ring& operator=(const ring&) = delete;
  io_uring* get() { return &ring_; }
  unsigned depth() const { return depth_; }

 private:
  io_uring ring_{};
  unsigned depth_;
};

// One ring per thread, reused across requests. Dropped after a failed submission: entries the kernel did not
// take are still queued in it and must never be submitted later.
thread_local std::unique_ptr<ring> tls_ring;

ring* thread_ring(unsigned depth) {
  if (!tls_ring || tls_ring->depth() < depth) {
    tls_ring.reset();
    tls_ring = std::make_unique<ring>(depth);
  }
  return tls_ring.get();
}

bool transient_submit_error(int r) { return r == -EINTR || r == -EAGAIN || r == -EBUSY; }

// A transient refusal (EAGAIN: no memory for requests right now; EBUSY: completions to reap first) is retried
// this many times in a row without progress before it counts as a failure.
constexpr unsigned k_transient_retries = 1000;

void prep(io_uring* rg, io_task& t, std::size_t index) {
  io_uring_sqe* sqe = io_uring_get_sqe(rg);
  // Depth bounds the tasks in flight, so a slot is always free.
  const std::size_t left = t.nbytes - t.done;
  if (t.write) {
    io_uring_prep_write(sqe, t.fd, t.buf + t.done, static_cast<unsigned>(left), t.offset + t.done);
  } else {
    io_uring_prep_read(sqe, t.fd, t.buf + t.done, static_cast<unsigned>(left), t.offset + t.done);
  }
  // Buffered I/O would run inline in the submitting thread (one core copying from the page cache); the async
  // flag hands it to the kernel's worker threads, which copy in parallel.
  if (!t.direct) sqe->flags |= IOSQE_ASYNC;
  io_uring_sqe_set_data64(sqe, index);
}

}  // namespace

const std::string& uring_unavailable_reason() {
  static const std::string reason = [] {
    io_uring probe{};
    int r = io_uring_queue_init(4, &probe, 0);
    if (r < 0) {
      return fmt::format("io_uring_setup failed: {} (old kernel, seccomp, or kernel.io_uring_disabled)",
                         std::strerror(-r));
    }
    io_uring_queue_exit(&probe);
    return std::string();
  }();
  return reason;
}

bool run_uring(std::span<io_task> tasks, unsigned depth, const io_observer* obs) {
  if (!uring_unavailable_reason().empty()) return false;
  depth = std::max(1u, std::min(depth, 256u));
  ring* rg = nullptr;
  try {
    rg = thread_ring(depth);
  } catch (const std::system_error&) {
    return false;
  }
  io_uring* r = rg->get();
  for (auto& t : tasks) {
    t.done = 0;
    t.ec.clear();
  }
  std::vector<bool> finished(tasks.size(), false);
  std::size_t next = 0;
  unsigned inflight = 0;  // prepared and not yet reaped: queued in the ring or held by the kernel
  bool failed = false;
  std::error_code submit_error;
  unsigned transient = 0;
  auto reap = [&]() -> unsigned {
    unsigned reaped = 0;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(r, &cqe) == 0) {
      const std::size_t i = io_uring_cqe_get_data64(cqe);
      io_task& t = tasks[i];
      int res = posix::sys().uring_result(t.write, t.fd, t.offset + t.done, t.nbytes - t.done, cqe->res);
      io_uring_cqe_seen(r, cqe);
      --inflight;
      ++reaped;
      bool again = false;
      if (res == -EINTR || res == -EAGAIN) {
        again = true;
      } else if (res < 0) {
        t.ec = std::error_code(-res, std::generic_category());
        failed = true;
      } else if (res == 0) {
        if (t.write) {
          t.ec = std::error_code(ENOSPC, std::generic_category());
          failed = true;
        }
        // read: end of file, the task ends short
      } else {
        t.done += static_cast<std::size_t>(res);
        if (obs != nullptr && t.direct) obs->completed(static_cast<std::size_t>(res));
        // A short O_DIRECT read that stops off a block boundary has reached end of file.
        bool eof = !t.write && t.direct && (t.offset + t.done) % t.alignment != 0;
        again = t.done < t.nbytes && !eof;
      }
      if (again && !failed) {
        prep(r, t, i);
        ++inflight;
      } else if (!again) {
        finished[i] = true;
      }
    }
    return reaped;
  };
  // io_uring takes at most 2 GiB - 4 KiB per operation; the planner's chunks are far smaller.
  while (true) {
    // The scheduler may lower the depth while the transfer runs (never above the ring's size).
    const unsigned limit = obs != nullptr ? std::clamp(obs->depth(), 1u, depth) : depth;
    while (!failed && inflight < limit && next < tasks.size()) {
      io_task& t = tasks[next];
      if (t.bounce || t.nbytes == 0) {
        run_task(t);
        finished[next] = true;
        if (t.ec) failed = true;
      } else {
        prep(r, t, next);
        ++inflight;
      }
      ++next;
    }
    if (inflight == 0) break;
    const int w = posix::sys().uring_submit_and_wait(r, 1);
    if (w < 0 && (!transient_submit_error(w) || ++transient > k_transient_retries)) {
      submit_error = std::error_code(-w, std::generic_category());
      failed = true;
      break;
    }
    if (reap() > 0 || w >= 0) transient = 0;
  }
  if (submit_error) {
    // The ring refused the submission. Entries it did not take stay queued; those it took are running and own
    // their buffers until they complete, so wait for exactly those before returning.
    unsigned held = inflight - io_uring_sq_ready(r);
    unsigned retries = 0;
    while (held > 0) {
      const int w = posix::sys().uring_wait(r);
      // Waiting itself failing for good leaves the rest to the kernel, which cancels it when the ring closes.
      if (w < 0 && (!transient_submit_error(w) || ++retries > k_transient_retries)) break;
      const unsigned before = inflight;
      reap();
      held -= std::min(held, before - inflight);
    }
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if (!finished[i] && !tasks[i].ec) tasks[i].ec = submit_error;
    }
    tls_ring.reset();  // the queued entries go with it, never submitted
  }
  return true;
}

#else

const std::string& uring_unavailable_reason() {
  static const std::string reason = "built without liburing";
  return reason;
}

bool run_uring(std::span<io_task>, unsigned, const io_observer*) { return false; }

#endif

}  // namespace gdskit::engine
