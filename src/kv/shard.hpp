// One volume of a store (a file in a folder, or a block device) and the index of the blocks on it: which slot
// holds which key, S3-FIFO eviction, pins, the window of slots that writes may use until the next checkpoint,
// and the index rebuild at open. Keys are spread over volumes by hash, so each volume is an independent
// shard with its own lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gdskit/batch.hpp"
#include "gdskit/file.hpp"
#include "gdskit/kv.hpp"
#include "kv/format.hpp"

namespace gdskit::kv::detail {

using clock = std::chrono::steady_clock;

/// Waits for `f` to end by `deadline`; cancels it when it has not. Returns true when it ended in time.
bool wait_or_cancel(const batch_future& f, clock::time_point deadline);

/// Whether nothing of the ready batch `f` still targets its memory. A batch whose ranges all ended by
/// themselves is released once its workers have done their bookkeeping, so that is waited for; one with
/// ranges ended by the deadline or cancel() may have a request the kernel still holds, so it is only asked.
bool settled(const batch_future& f);

/// Runs fdatasync on `file` from a helper thread and waits for it until `deadline` (a sync that does not
/// return cannot hold the caller). Returns the sync's error, ETIMEDOUT when it did not end in time.
std::error_code sync_until(const std::shared_ptr<const file_handle>& file, clock::time_point deadline);

/// Futures past their deadline whose requests the kernel still holds, with what they hold (memory, slots):
/// kept until released, then handed back. Never drops a future that is not released (destroying it would
/// block); others may share it (an operation's future keeps its batch for its descriptor).
class quarantine {
 public:
  struct entry {
    std::shared_ptr<const batch_future> future;
    std::function<void()> on_release;
  };
  void add(std::shared_ptr<const batch_future> f, std::function<void()> on_release);
  /// Hands back everything released so far.
  void reap();
  /// Waits until everything is released (close), for at most `limit`; returns whether it all was.
  bool drain(std::chrono::nanoseconds limit);
  std::size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::vector<entry> entries_;
};

enum class slot_state : std::uint8_t {
  free,         ///< holds nothing the index knows of
  valid,        ///< holds a published block; in a queue
  doomed,       ///< holds a published block chosen for eviction: readable until its slot is written again
  writing,      ///< a put is writing it
  quarantined,  ///< a write past its deadline may still land here
  dropping,     ///< its block failed a check; becomes free when its last reader leaves
};

struct slot_meta {
  key k;
  std::uint64_t sequence = 0;
  std::uint32_t data_crc = 0;
  std::uint32_t pins = 0;
  std::int32_t prev = -1, next = -1;  // links of its queue (toward the head / toward the tail)
  std::uint16_t readers = 0;
  slot_state state = slot_state::free;
  std::uint8_t freq = 0;   // S3-FIFO's access count, 0..3
  std::uint8_t queue = 0;  // 0 none, 1 small, 2 main
};

/// A get's claim on a slot: the slot cannot be written again until end_read.
struct read_ticket {
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
  std::uint32_t data_crc = 0;
};

/// What begin_write decided.
enum class write_claim { write, present, not_admitted, no_space, failed };

/// How the shard was opened.
struct shard_open {
  std::shared_ptr<const file_handle> file;
  /// The same file through the page cache: where block headers are written (see header_file()); empty: `file`.
  std::shared_ptr<const file_handle> headers;
  layout geometry;
  store_uuid uuid{};
  std::uint32_t volume = 0;
  std::uint64_t namespace_hash = 0;
  durability mode = durability::cache;
  admission admit = admission::always;
  bool block_device = false;
  std::filesystem::path data_path;  ///< the file (or device) holding the volume
};

class shard {
 public:
  explicit shard(shard_open o);

  /// Rebuilds the index from the checkpoints and block headers on disk (or starts empty for a new volume).
  /// Adds what it did to `info`; returns the next sequence number it saw.
  std::uint64_t recover(bool created, bool ignore_checkpoint, recovery_info& info);

  const file_handle& file() const noexcept { return *file_; }
  /// The file for block headers: through the page cache, so that a put's 4 KiB header, written once its data
  /// is, returns without queueing on the device behind other puts' data (O_DIRECT reads of headers and the
  /// syncs of "persist" see it, as the kernel flushes the range first).
  const file_handle& header_file() const noexcept { return *headers_; }
  const std::shared_ptr<const file_handle>& file_ptr() const noexcept { return file_; }
  const layout& geometry() const noexcept { return geometry_; }
  const store_uuid& uuid() const noexcept { return uuid_; }
  std::uint32_t volume() const noexcept { return volume_; }
  std::uint64_t namespace_hash() const noexcept { return namespace_hash_; }
  const std::filesystem::path& data_path() const noexcept { return data_path_; }
  bool block_device() const noexcept { return block_device_; }

  // ---- index ----
  bool contains(const key& k) const;
  /// Claims the slot of `k` for reading; nullopt when `k` is not held.
  std::optional<read_ticket> begin_read(const key& k);
  enum class read_outcome { hit, bad, other };
  /// Ends a read: a hit counts as an access (S3-FIFO), a bad block leaves the index.
  void end_read(const key& k, const read_ticket& t, read_outcome outcome);

  /// Claims a slot for writing `k` with sequence `seq`: present when `k` is held or being written;
  /// not_admitted under second-hit admission for a first sighting; no_space when every block is pinned or a
  /// checkpoint cannot be written now (ec says why). May write a checkpoint first (by `deadline`).
  write_claim begin_write(const key& k, std::uint64_t seq, std::uint64_t next_sequence, clock::time_point deadline,
                          std::uint32_t& slot, std::error_code& ec);
  /// The block of `slot` is on disk: it joins the index.
  void publish(std::uint32_t slot, std::uint32_t data_crc);
  /// The write into `slot` failed; `still_in_flight`: the kernel may still write there (quarantined until
  /// release_slot).
  void abandon(std::uint32_t slot, bool still_in_flight);
  /// A quarantined slot's write has ended.
  void release_slot(std::uint32_t slot);

  bool pin(const key& k);
  void unpin(const key& k);

  /// Writes a checkpoint with an empty window (close): the next open reads nothing else.
  void final_checkpoint(std::uint64_t next_sequence, clock::time_point deadline);

  struct counts {
    std::uint64_t blocks = 0, pinned = 0, evictions = 0, checkpoints = 0, checkpoint_bytes = 0;
  };
  counts count() const;
  /// Bytes the volume occupies on disk now (st_blocks of the file; for a block device, what the store wrote).
  std::uint64_t physical_bytes() const;

  quarantine& held() noexcept { return quarantine_; }

 private:
  // All below with mutex_ held unless said otherwise.
  void queue_push_head(std::uint32_t s, std::uint8_t q);
  void queue_remove(std::uint32_t s);
  std::optional<std::uint32_t> choose_victim();
  std::optional<std::uint32_t> take_from_window();
  void forget(std::uint32_t s);  // out of the map and the queues
  bool ghost_contains(std::uint64_t h) const;
  void ghost_add(std::uint64_t h);
  /// Writes a checkpoint whose window holds every slot a write may touch until the next one: slots being
  /// written or quarantined, and (unless `closing`) up to window_target_ fresh ones. Called without mutex_.
  std::error_code checkpoint(std::uint64_t next_sequence, clock::time_point deadline, bool closing);

  std::shared_ptr<const file_handle> file_;
  std::shared_ptr<const file_handle> headers_;
  layout geometry_;
  store_uuid uuid_;
  std::uint32_t volume_;
  std::uint64_t namespace_hash_;
  durability mode_;
  admission admit_;
  bool block_device_;
  std::filesystem::path data_path_;

  mutable std::mutex mutex_;
  std::vector<slot_meta> slots_;
  std::unordered_map<key, std::uint32_t, key_hasher> map_;
  struct fifo {
    std::int32_t head = -1, tail = -1;
    std::size_t size = 0;
  };
  fifo small_, main_;
  std::size_t small_target_ = 1;
  // Ghost (keys evicted from the small queue) and, under second-hit admission, keys seen once: bounded FIFOs of
  // key hashes with counts (a hash may be in the ring more than once).
  struct hash_ring {
    std::deque<std::uint64_t> order;
    std::unordered_map<std::uint64_t, std::uint32_t> count;
    std::size_t limit = 0;
    bool contains(std::uint64_t h) const { return count.count(h) != 0; }
    void add(std::uint64_t h);
    void erase(std::uint64_t h);
  };
  hash_ring ghost_, seen_;
  std::vector<std::uint32_t> free_;        // free slots not in the window
  std::vector<std::uint32_t> window_;      // slots writes may use now
  std::size_t window_next_ = 0;
  std::vector<std::uint32_t> deferred_;    // doomed window slots that had readers when their turn came
  std::unordered_set<std::uint32_t> busy_;  // writing or quarantined
  std::size_t window_target_ = 1;
  std::uint64_t generation_ = 0;
  bool checkpoint_stuck_ = false;  // a checkpoint write past its deadline is still in flight
  std::uint64_t blocks_ = 0, pinned_ = 0, evictions_ = 0, checkpoints_ = 0, checkpoint_bytes_ = 0;

  std::mutex checkpoint_mutex_;  // one checkpoint at a time; taken before mutex_
  quarantine quarantine_;
};

}  // namespace gdskit::kv::detail
