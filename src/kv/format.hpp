// The store's on-disk format: one volume per path (a file in a folder, or a block device), laid out as
//   [superblock: 4 KiB][checkpoint copy A][checkpoint copy B][slot 0][slot 1]...
// and each slot as [block data, padded to 4 KiB][block header: 4 KiB]. Every structure carries a CRC32C of
// itself; the block header also carries the CRC32C of the data. All integers are little-endian.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "gdskit/checksum.hpp"
#include "gdskit/kv.hpp"

namespace gdskit::kv::detail {

inline constexpr std::size_t page_bytes = 4096;
inline constexpr std::size_t max_namespace_bytes = 1024;
inline constexpr std::size_t max_block_bytes = std::size_t{1} << 30;
/// The largest volume (capacity per path): far below the largest file offset, so that no layout's sums overflow.
inline constexpr std::uint64_t max_volume_bytes = std::uint64_t{1} << 60;
inline constexpr std::uint32_t format_version = 1;
/// Bytes of one checkpoint entry (one per slot) and of one window entry.
inline constexpr std::size_t checkpoint_entry_bytes = 48;
inline constexpr std::size_t window_entry_bytes = 4;

using store_uuid = std::array<std::uint8_t, 16>;

constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t to) noexcept { return (n + to - 1) / to * to; }

/// Where everything lies on one volume.
struct layout {
  std::uint64_t block_bytes = 0;
  std::uint64_t slot_bytes = 0;      ///< data padded to 4 KiB, plus the header page
  std::uint64_t header_offset = 0;   ///< of the header page within a slot (= data padded to 4 KiB)
  std::uint64_t slots = 0;
  std::uint64_t checkpoint_offset = 0;  ///< of copy A; copy B follows it
  std::uint64_t checkpoint_bytes = 0;   ///< of one copy: header page + entries + window, padded to 4 KiB
  std::uint64_t slot_offset = 0;        ///< of slot 0
  std::uint64_t end_bytes = 0;          ///< size of the whole volume
  /// Room kept for the file system's own blocks of a volume file: the extent tree of a preallocated file
  /// written in random places grows with the number of written and unwritten runs (up to two per slot, for
  /// its data and its header), and those blocks count in the file's physical size.
  std::uint64_t reserve_bytes = 0;

  /// What the volume may occupy: the capacity share it needs.
  std::uint64_t budget_bytes() const noexcept { return end_bytes + reserve_bytes; }

  std::uint64_t slot_position(std::uint64_t slot) const noexcept { return slot_offset + slot * slot_bytes; }
  std::uint64_t header_position(std::uint64_t slot) const noexcept { return slot_position(slot) + header_offset; }
  std::uint64_t checkpoint_position(unsigned copy) const noexcept {
    return checkpoint_offset + copy * checkpoint_bytes;
  }
};

/// The layout of a volume of `slots` slots of `block_bytes` each.
layout make_layout(std::uint64_t block_bytes, std::uint64_t slots) noexcept;
/// The most slots of `block_bytes` whose volume (its reserve included) fits in `budget_bytes` (0 when not even
/// one does).
std::uint64_t slots_within(std::uint64_t block_bytes, std::uint64_t budget_bytes) noexcept;

/// The CRC32C of bytes A followed by bytes B, from crc32c(A) = `crc_a`, crc32c(B) = `crc_b` and B's length:
/// what a block written in pieces sums to, from the sums the transfer core reports per piece.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t b_bytes) noexcept;

/// 64-bit hash of a namespace text (FNV-1a with a final mix).
std::uint64_t namespace_hash(std::string_view text) noexcept;

/// The first page of a volume.
struct superblock {
  store_uuid uuid{};
  std::uint32_t volume_index = 0, volume_count = 0;
  std::uint64_t block_bytes = 0, slot_bytes = 0, slots = 0, slot_offset = 0, checkpoint_offset = 0,
                checkpoint_bytes = 0, capacity_bytes = 0, namespace_hash = 0, created_unix_ns = 0;
  std::string name_space;
};

enum class page_kind { ok, blank, foreign, damaged, newer };
/// Writes `sb` into a zeroed 4 KiB page.
void encode_superblock(const superblock& sb, std::span<std::uint8_t, page_bytes> page) noexcept;
/// blank: all zero; foreign: no magic (something else lives here); damaged: our magic but a bad CRC or
/// impossible fields; newer: a format version this build does not know.
page_kind decode_superblock(std::span<const std::uint8_t, page_bytes> page, superblock& out) noexcept;

/// The header written after a block's data.
struct block_header {
  store_uuid uuid{};
  std::uint64_t namespace_hash = 0;
  std::uint64_t sequence = 0;
  std::uint32_t volume = 0;
  std::uint64_t slot = 0;
  std::uint64_t data_bytes = 0;
  std::uint32_t data_crc = 0;
  key k;
};
/// Writes the header into the first bytes of a zeroed page.
void encode_header(const block_header& h, std::uint8_t* page) noexcept;
/// Whether the page holds a header with a good magic, version, CRC and key (sets `h`).
bool decode_header(const std::uint8_t* page, block_header& h) noexcept;

/// One checkpoint entry (slot i of the volume is entry i; kind none = empty).
struct checkpoint_entry {
  std::uint32_t data_crc = 0;
  std::uint64_t sequence = 0;
  key k;
};
void encode_entry(const checkpoint_entry& e, std::uint8_t* out) noexcept;
/// False for a malformed entry (an empty entry decodes to kind none and true).
bool decode_entry(const std::uint8_t* in, checkpoint_entry& e) noexcept;

/// The first page of a checkpoint copy. The body after it: `slots` entries, then `window_count` slot numbers.
struct checkpoint_header {
  store_uuid uuid{};
  std::uint64_t generation = 0;
  std::uint64_t next_sequence = 0;
  std::uint64_t slots = 0;
  std::uint64_t window_count = 0;
  std::uint64_t body_bytes = 0;
  std::uint32_t body_crc = 0;
  bool clean = false;
  /// The namespace whose index it is: the index is what gets are checked against, so it must never be taken
  /// for another namespace's (a superblock rewritten to claim another namespace still finds no block).
  std::uint64_t namespace_hash = 0;
};
void encode_checkpoint_header(const checkpoint_header& h, std::uint8_t* page) noexcept;
bool decode_checkpoint_header(const std::uint8_t* page, checkpoint_header& h) noexcept;

}  // namespace gdskit::kv::detail
