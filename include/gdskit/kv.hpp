// A KV-cache block store: fixed-size blocks under keys (block hashes), kept on one or more folders or block
// devices within a fixed capacity, read back checked (CRC32C) or not at all, within a deadline.
//
// Contract in short (docs/kv.md has the on-disk format and the crash model):
//  - get() returns, per key, the bytes of the last successful put() of that key in this namespace, or a miss.
//    Never other bytes: every read is checked against the CRC32C its block header recorded (the index holds
//    it; headers themselves are checked when the index is rebuilt); a mismatch is a miss and a counter, and
//    the bytes that failed never reach the caller's memory.
//  - After kill -9 at any moment the store opens again and rebuilds its index from what is on disk.
//  - Physical use never exceeds capacity_bytes. Eviction is S3-FIFO; pinned blocks are never evicted.
//  - Every operation ends by its deadline: keys not finished by then are misses (gets) or not stored (puts),
//    and nothing is written into the caller's memory after the call returned or its future became ready.
//  - One process opens a store folder for writing at a time (a lock): a second opener gets EBUSY.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "gdskit/buffer.hpp"
#include "gdskit/path.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::kv {

/// A block's key: a block hash of 1 to 32 bytes, or an integer whose magnitude is below 2^256. The kind is
/// part of the identity: the bytes "\x01" and the integer 1 are different keys. Keys compare by value.
class key {
 public:
  enum class kind : std::uint8_t { none = 0, bytes = 1, integer = 2, negative_integer = 3 };

  /// The empty key (kind none); not accepted by the store.
  key() noexcept = default;
  /// A byte string of 1..32 bytes. Throws gdskit::error (EINVAL) for an empty or longer one.
  static key from_bytes(std::span<const std::uint8_t> bytes);
  static key from_bytes(std::string_view bytes);
  static key from_int(std::int64_t value) noexcept;
  static key from_uint(std::uint64_t value) noexcept;
  /// An integer given as its magnitude (little-endian bytes; zero bytes at the top are ignored) and its sign.
  /// Throws gdskit::error (EINVAL) when the magnitude needs more than 32 bytes.
  static key from_magnitude(std::span<const std::uint8_t> magnitude_le, bool negative);

  kind type() const noexcept { return static_cast<kind>(kind_); }
  /// Bytes of the byte string, or of the integer's magnitude (little-endian, no zero bytes at the top).
  std::size_t size() const noexcept { return size_; }
  const std::uint8_t* data() const noexcept { return bytes_.data(); }
  /// A 64-bit mix of the whole identity (kind, size, bytes), for hash tables and shard choice.
  std::uint64_t hash() const noexcept;
  /// For messages: 0x-prefixed hex of the bytes, or the integer in hex ("int:0x1f", "int:-0x1f").
  std::string to_string() const;

  friend bool operator==(const key& a, const key& b) noexcept {
    return a.kind_ == b.kind_ && a.size_ == b.size_ && a.bytes_ == b.bytes_;
  }

 private:
  std::uint8_t kind_ = 0;
  std::uint8_t size_ = 0;
  std::array<std::uint8_t, 32> bytes_{};  // unused bytes are zero, so == compares the whole array
};

struct key_hasher {
  std::size_t operator()(const key& k) const noexcept { return static_cast<std::size_t>(k.hash()); }
};

/// cache: nothing is synced (a crash of the process keeps what the kernel has; power loss may lose recent
/// blocks, never turn them into wrong bytes). persist: a put returns true only once its data and then its
/// header are on stable storage (fdatasync after each), and index checkpoints are synced.
enum class durability { cache, persist };
/// always: every put is stored. second_hit: a key is stored the second time it is put (the first put returns
/// false with EAGAIN and is remembered), which keeps one-off blocks from pushing out reused ones.
enum class admission { always, second_hit };

std::string_view to_string(durability d) noexcept;
std::string_view to_string(admission a) noexcept;

/// How a store is opened.
struct store_options {
  /// Folders (created when missing) or block devices; blocks are spread over them by key. At least one. A
  /// block device must be blank (its first 4 KiB zero) or hold a store of this kind.
  std::vector<std::filesystem::path> paths;
  /// Most bytes the store may occupy, all paths together (data, block headers, superblocks, checkpoints).
  std::uint64_t capacity_bytes = 0;
  /// Size of every block (1 byte .. 1 GiB).
  std::size_t block_bytes = 0;
  /// Part of every key's identity (model revision, dtype, layout, rank): at most 1024 bytes. A store holding
  /// another namespace is refused at open.
  std::string name_space;
  durability mode = durability::cache;
  /// The default deadline of every operation (> 0).
  std::chrono::nanoseconds deadline = std::chrono::seconds(2);
  admission admit = admission::always;
  /// Threads that finish submitted puts of durability::persist (their syncs block) and gets of blocks over
  /// 8 MiB in the background (0: 4). Other operations need none: a get's future is the transfer core's batch,
  /// and a cache put writes its headers on its data batch's completion.
  unsigned async_workers = 0;
  /// Reserve each data file's whole size when the store is made (fallocate), so that a disk too small is
  /// refused at open and writes never wait on block allocation; false: sparse files that grow as blocks are
  /// written (never past the capacity either way). Block devices are used as they are.
  bool preallocate = true;
  /// Rebuild the index by reading every block header even when a checkpoint exists (to measure the scan).
  bool ignore_checkpoint = false;
  /// I/O settings of the store's files (O_DIRECT mode, engine, ...). GPU memory always takes the staged path
  /// (mode gds or compat become staged): the checksum is computed on the bytes while they sit in host memory.
  settings io = default_settings();
};

/// Per-operation options.
struct op_options {
  /// When the operation must have ended; unset: now + store_options::deadline.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  /// A CUDA stream (CUstream) to order the operation with; nullptr for none. Needs a usable GPU (ENODEV).
  /// get: work queued on the stream after the call waits, on the GPU, until every hit has landed in `out`
  /// (the host is not blocked; blocks over 8 MiB are the exception: the call returns once they landed).
  /// put: the blocks are read once the stream has reached the point of the call, so a kernel queued before
  /// it has finished writing them.
  void* stream = nullptr;
};

/// The outcome of a put or get: one entry per key, in the order given.
struct op_result {
  /// put: the key is stored (or already was). get: a hit, and its row of `out` holds the block.
  std::vector<bool> ok;
  /// Why a key is not ok (empty when ok): ENOENT not stored, EBADMSG the block failed its check, ETIMEDOUT
  /// the deadline passed, ECANCELED cancel(), ENOSPC no room (the disk is full, or every block is pinned), EIO
  /// a device error, EAGAIN not admitted yet (second_hit admission).
  std::vector<std::error_code> errors;
  std::size_t ok_count = 0;
  /// Seconds from the call (or submit) until its last block ended (not until the outcome was first looked at).
  double seconds = 0;
};

namespace detail {
struct op_state;
}

/// The completion of submit_put/submit_get: the same model as gdskit::batch_future (block with a timeout,
/// poll an event descriptor, cancel). A get of blocks up to 8 MiB is one batch of the transfer core, and its
/// wait, descriptor, cancel, deadline and stream ordering are that batch's; the store settles its keys (hits,
/// counters, index) when the future is first seen ready, or at the store's next call. Move-only; destroying it
/// waits until the operation has ended (at the latest its deadline).
class op_future {
 public:
  /// An empty future: valid() is false and every other call throws gdskit::error (EINVAL).
  op_future() noexcept;
  explicit op_future(std::shared_ptr<detail::op_state> state) noexcept;
  ~op_future();
  op_future(op_future&&) noexcept;
  op_future& operator=(op_future&&) noexcept;
  op_future(const op_future&) = delete;
  op_future& operator=(const op_future&) = delete;

  bool valid() const noexcept { return state_ != nullptr; }
  /// Whether the operation has ended (every key decided).
  bool ready() const;
  /// Blocks until ready(); never longer than the operation's deadline (plus the time to check what arrived).
  void wait() const;
  /// Blocks until ready() or the timeout; returns ready().
  bool wait_for(std::chrono::nanoseconds timeout) const;
  /// An eventfd that becomes readable once ready() and stays readable. Owned by the future: do not read or
  /// close it.
  int fd() const;
  /// Asks the operation to stop: keys not yet decided end with ECANCELED. Returns false when it had already
  /// ended.
  bool cancel() const;
  /// Waits until ready(), then the outcome (valid while the future lives).
  const op_result& get() const;
  /// Whether the store no longer touches the caller's memory. A get: equals ready() (blocks are checked in
  /// staging memory and copied into `out` only while the transfer core holds their key, so nothing lands after
  /// it). A put: ready() and no request past the deadline still reads `blocks` (such a request may read them
  /// for a while; what it writes is never served).
  bool released() const;
  /// Blocks until released() (never past the kernel's end of a request the deadline left behind).
  void wait_released() const;

 private:
  std::shared_ptr<detail::op_state> state_;
};

/// How the store was found at open.
struct recovery_info {
  double seconds = 0;              ///< open: lock, superblocks, index rebuild
  bool created = false;            ///< a new store was made
  bool from_checkpoint = false;    ///< the index came from a checkpoint (plus the headers it names)
  bool clean = false;              ///< the checkpoint was written by close(): nothing was read beyond it
  std::uint64_t blocks = 0;        ///< blocks found
  std::uint64_t headers_read = 0;  ///< block headers read to rebuild the index
  std::uint64_t bad_headers = 0;   ///< headers that were present but failed their checks (skipped)
  std::uint64_t bytes_read = 0;    ///< bytes read to rebuild (checkpoints and headers)
};

/// Counters since open (keys, not calls) and the state now.
struct store_stats {
  std::uint64_t capacity_bytes = 0, block_bytes = 0, slot_bytes = 0;
  std::uint64_t slots = 0;            ///< blocks the store can hold
  std::uint64_t blocks = 0;           ///< blocks held now
  std::uint64_t pinned = 0;           ///< blocks pinned now
  std::uint64_t physical_bytes = 0;   ///< bytes the store's files occupy on disk now (st_blocks)
  std::uint64_t puts = 0, stored = 0, already_present = 0, put_failures = 0, not_admitted = 0;
  std::uint64_t gets = 0, hits = 0, misses = 0;
  std::uint64_t checksum_failures = 0;  ///< reads whose header or CRC32C did not match (served as misses)
  std::uint64_t timeouts = 0, cancelled = 0, io_errors = 0, no_space = 0;
  std::uint64_t evictions = 0, checkpoints = 0;
  std::uint64_t bytes_written = 0, bytes_read = 0;  ///< to and from the store's devices, everything included
  std::uint64_t quarantined = 0;  ///< requests past their deadline that the kernel still holds
  recovery_info recovery;
  durability mode = durability::cache;
  /// The path blocks take to memory on a GPU (staged through the transfer core's pinned memory when a GPU is
  /// usable, else host), with the reasons; and whether the files use O_DIRECT, with the reason ("tmpfs
  /// refuses O_DIRECT").
  data_path path = data_path::host;
  std::vector<std::string> path_reasons;
  bool direct = false;
  std::string direct_reason;
};

/// The capacity_bytes a store needs to hold `blocks` blocks of `block_bytes` over `paths` paths (each path
/// holds an equal share, rounded up): every block takes its size rounded up to 4 KiB plus a 4 KiB header, and
/// each path a superblock and two index checkpoints. Throws gdskit::error (EINVAL) for a block size of 0 or
/// over 1 GiB, or no path.
std::uint64_t capacity_for(std::uint64_t blocks, std::size_t block_bytes, std::size_t paths = 1);

class block_store {
 public:
  /// An empty (closed) store: every operation throws gdskit::error (EBADF).
  block_store() noexcept;
  /// Opens or creates the store. Throws gdskit::error naming the path: EINVAL for bad options (no path, block
  /// size 0 or over 1 GiB, capacity below one block per path, namespace over 1024 bytes, deadline <= 0);
  /// ENOTDIR for a path that is a regular file; EBUSY when another process (or another store of this process)
  /// has it open; EEXIST when it holds a store of another block size, capacity, namespace or set of paths
  /// (nothing is changed); EBADMSG when its superblock is damaged or a block device holds something else; and
  /// the errno of a failed open or write (EACCES, EROFS, ENOSPC).
  explicit block_store(const store_options& options);
  /// Closes (see close()); errors are logged, not thrown.
  ~block_store();
  block_store(block_store&&) noexcept;
  block_store& operator=(block_store&&) noexcept;
  block_store(const block_store&) = delete;
  block_store& operator=(const block_store&) = delete;

  /// Stores blocks[i] under keys[i]. Each view must be exactly block_bytes of host, pinned or GPU memory;
  /// the blocks have been written when it returns (the memory may be reused at once; after a deadline a
  /// request the kernel still holds may read it for a while, and what it writes is never served). A key
  /// already stored (or being stored) is left as it is and reports true. Throws gdskit::error (EINVAL) before
  /// any I/O for a key of kind none, a count mismatch or a wrong-sized view, ENODEV for GPU memory (or a
  /// stream) without a usable GPU.
  op_result put(std::span<const key> keys, std::span<const buffer_view> blocks, const op_options& options = {});
  /// Reads the blocks of `keys` into out[i] (exactly block_bytes each, host, pinned or GPU memory, no two
  /// overlapping). Only rows of hits are written, and none after the call returns. Throws like put.
  op_result get(std::span<const key> keys, std::span<const buffer_view> out, const op_options& options = {});
  /// Asynchronous put/get: checks as above, starts the I/O and returns. The views' memory must stay valid (and
  /// a put's unchanged) until the future is released().
  op_future submit_put(std::span<const key> keys, std::span<const buffer_view> blocks, const op_options& options = {});
  op_future submit_get(std::span<const key> keys, std::span<const buffer_view> out, const op_options& options = {});
  /// Whether each key is held (in memory: no I/O). A key held may still miss in get() when its block fails
  /// its check on disk.
  std::vector<bool> lookup(std::span<const key> keys) const;
  /// How many leading keys are held.
  std::size_t prefix(std::span<const key> keys) const;
  /// Pins held keys so that they are not evicted (counted: each pin needs an unpin). Returns, per key,
  /// whether it is held and now pinned. Pins are not kept across close.
  std::vector<bool> pin(std::span<const key> keys);
  /// Undoes one pin of each key; keys not pinned are ignored.
  void unpin(std::span<const key> keys);
  store_stats stats() const;
  /// Waits for the operations in flight to end, writes an index checkpoint (synced under persist) and releases
  /// the lock. Requests the kernel still holds past a deadline are waited for (they end when the device
  /// answers). Throws gdskit::error when the checkpoint cannot be written (the store still closes: the next
  /// open rebuilds from the block headers). Closing a closed store does nothing.
  void close();
  bool is_open() const noexcept { return impl_ != nullptr; }
  const store_options& options() const;

  struct impl;  ///< opaque

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace gdskit::kv
