// A GPU for tests on machines without one: "device" memory is host memory that the transfer core reaches only
// through a group copier whose copies land `delay` after their group was flushed, on a thread of the copier's
// own. A driver that delivered a range before its copy landed, copied into a range after reporting it, or
// issued one copy launch per range fails the tests that use it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <system_error>

#include "engine/transfer/route.hpp"
#include "gdskit/buffer.hpp"

namespace gdskit::test {

/// What the fake GPU's copiers did.
struct copier_stats {
  std::atomic<int> groups{0};
  std::atomic<int> copies{0};
  std::atomic<int> live_chunks{0};
  /// Staging chunks mapped at an address an earlier chunk of the process had (unmapped since).
  std::atomic<int> chunks_at_old_addresses{0};
  /// Groups flushed and not yet landed, at most, over the copier's life.
  std::atomic<int> most_pending{0};
  /// Copies in one group, at most.
  std::atomic<int> largest_group{0};
  /// Groups ended by the driver's poll() rather than by their callback (copiers with a landing word).
  std::atomic<int> polled{0};
  /// Groups ended by their callback.
  std::atomic<int> called_back{0};
  /// Calls of arm() that had a group to arm.
  std::atomic<int> arms{0};
  /// Called by flush() on the driver's thread before it takes a group (set before the copier is used).
  std::function<void()> on_flush;
  /// Called by flush() on the driver's thread with the groups already in flight and the bytes of the group it
  /// takes (set before the copier is used).
  std::function<void(int in_flight, std::size_t bytes)> on_group;
};

/// How the fake copier tells that a group landed.
struct fake_landing {
  /// A landing word the driver can poll: set the moment a group's copies have landed, while the group's
  /// callback comes `callback_after` later (as a host function on a second stream may).
  bool word = false;
  std::chrono::milliseconds callback_after{0};
  /// Copies land inside flush() itself (a copy faster than the driver's next look), and the word shows it then.
  bool at_flush = false;
  /// Callbacks only for the groups flushed before the latest arm() (as the CUDA copier queues them): a driver
  /// that sleeps without arming waits until it looks at the word again.
  bool callbacks_when_armed = false;
};

/// A gpu_backend whose only route is the group copier above; the other routes throw ENOTSUP (cuFile batches
/// say "not taken"). Copies fail with `fail` when it is set (nothing is copied then).
std::unique_ptr<engine::gpu_backend> make_fake_gpu(copier_stats& stats, std::chrono::milliseconds delay,
                                                   std::error_code fail = {}, fake_landing landing = {});

/// A gpu_backend whose copier takes groups and never finishes them, as on a device whose context broke: its
/// failure() then says `broken`.
std::unique_ptr<engine::gpu_backend> make_dead_gpu(copier_stats& stats, std::error_code broken);

/// `n` bytes at `p` as memory of device 0 (host memory that only the fake GPU's copier touches).
inline buffer_view fake_device(void* p, std::size_t n) { return {p, n, memory_kind::device, 0}; }

}  // namespace gdskit::test
