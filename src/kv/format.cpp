#include "kv/format.hpp"

#include <algorithm>
#include <cstring>

namespace gdskit::kv::detail {
namespace {

constexpr char superblock_magic[8] = {'G', 'D', 'S', 'K', 'I', 'T', 'K', 'V'};
constexpr char header_magic[8] = {'G', 'D', 'S', 'K', 'V', 'B', 'L', 'K'};
constexpr char checkpoint_magic[8] = {'G', 'D', 'S', 'K', 'V', 'I', 'D', 'X'};
// Bytes of the block header and of the checkpoint header that their CRCs cover (the rest of the page is zero).
constexpr std::size_t header_bytes = 128;
constexpr std::size_t checkpoint_header_bytes = 128;

void put32(std::uint8_t* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put64(std::uint8_t* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get32(const std::uint8_t* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get64(const std::uint8_t* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The CRC of `n` bytes at `p` with the 4 bytes at `crc_at` counted as zero.
std::uint32_t crc_without(const std::uint8_t* p, std::size_t n, std::size_t crc_at) noexcept {
  const std::uint8_t zero[4] = {0, 0, 0, 0};
  std::uint32_t c = crc32c(p, crc_at);
  c = crc32c(zero, 4, c);
  return crc32c(p + crc_at + 4, n - crc_at - 4, c);
}

// Product of a and b, polynomials over GF(2) in CRC32C's reflected bit order, modulo its polynomial.
std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) noexcept {
  constexpr std::uint32_t poly = 0x82F63B78u;
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if ((a & bit) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ poly : b >> 1;
  }
  return product;
}

// Key: kind (1 byte), size (1 byte), then 32 bytes. False when the fields cannot describe a key.
void put_key(std::uint8_t* kind_at, std::uint8_t* bytes_at, const key& k) noexcept {
  kind_at[0] = static_cast<std::uint8_t>(k.type());
  kind_at[1] = static_cast<std::uint8_t>(k.size());
  std::memcpy(bytes_at, k.data(), 32);
}
bool get_key(const std::uint8_t* kind_at, const std::uint8_t* bytes_at, key& out) noexcept {
  const auto kind = static_cast<key::kind>(kind_at[0]);
  const std::size_t size = kind_at[1];
  if (size > 32) return false;
  for (std::size_t i = size; i < 32; ++i) {
    if (bytes_at[i] != 0) return false;  // keys keep their unused bytes zero
  }
  try {
    switch (kind) {
      case key::kind::bytes: out = key::from_bytes(std::span<const std::uint8_t>(bytes_at, size)); return true;
      case key::kind::integer:
      case key::kind::negative_integer:
        // Integers are stored without zero bytes at the top, and there is no negative zero.
        if (size > 0 && bytes_at[size - 1] == 0) return false;
        if (kind == key::kind::negative_integer && size == 0) return false;
        out = key::from_magnitude(std::span<const std::uint8_t>(bytes_at, size), kind == key::kind::negative_integer);
        return true;
      default: return false;
    }
  } catch (...) {
    return false;
  }
}

bool all_zero(const std::uint8_t* p, std::size_t n) noexcept {
  return std::all_of(p, p + n, [](std::uint8_t b) { return b == 0; });
}

}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t b_bytes) noexcept {
  // A CRC is linear: crc(A || B) = crc_a * x^(8 * |B|) + crc_b (mod P), the initial and final inversions
  // cancelling out. x^(8 * |B|) is built from the squares x^(2^k), one per set bit of 8 * |B|.
  std::uint32_t x_power = 1u << 30;  // x^1
  std::uint32_t shift = 1u << 31;    // x^0
  for (std::uint64_t bits = b_bytes * 8; bits != 0; bits >>= 1) {
    if ((bits & 1u) != 0) shift = multiply_mod_p(shift, x_power);
    x_power = multiply_mod_p(x_power, x_power);
  }
  return multiply_mod_p(shift, crc_a) ^ crc_b;
}

layout make_layout(std::uint64_t block_bytes, std::uint64_t slots) noexcept {
  layout l;
  l.block_bytes = block_bytes;
  l.header_offset = round_up(block_bytes, page_bytes);
  l.slot_bytes = l.header_offset + page_bytes;
  l.slots = slots;
  l.checkpoint_offset = page_bytes;
  l.checkpoint_bytes = page_bytes + round_up(slots * (checkpoint_entry_bytes + window_entry_bytes), page_bytes);
  l.slot_offset = l.checkpoint_offset + 2 * l.checkpoint_bytes;
  l.end_bytes = l.slot_offset + slots * l.slot_bytes;
  // Up to 4 extents per slot (its data and its header each written apart from unwritten neighbours) and a few
  // for the superblock and checkpoints; leaves of 4 KiB hold 340 extents and are counted half full, plus the
  // index blocks above them.
  const std::uint64_t extents = 4 * slots + 16;
  l.reserve_bytes = page_bytes * ((extents + 169) / 170 + 3);
  return l;
}

std::uint64_t slots_within(std::uint64_t block_bytes, std::uint64_t budget_bytes) noexcept {
  budget_bytes = std::min(budget_bytes, max_volume_bytes);  // larger budgets would overflow the layout's sums
  if (make_layout(block_bytes, 1).budget_bytes() > budget_bytes) return 0;
  // The most slots whose volume fits: a layout grows with its slots, so a binary search between one slot and
  // what the slots alone would fill.
  std::uint64_t lo = 1, hi = budget_bytes / make_layout(block_bytes, 1).slot_bytes + 1;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo + 1) / 2;
    if (make_layout(block_bytes, mid).budget_bytes() <= budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

std::uint64_t namespace_hash(std::string_view text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

// Superblock fields: 0 magic, 8 version, 12 crc, 16 uuid, 32 volume index, 36 volume count, 40 block bytes,
// 48 slot bytes, 56 slots, 64 slot offset, 72 checkpoint offset, 80 checkpoint bytes, 88 capacity,
// 96 namespace hash, 104 namespace length, 112 created (ns), 128.. namespace text.
void encode_superblock(const superblock& sb, std::span<std::uint8_t, page_bytes> page) noexcept {
  std::uint8_t* p = page.data();
  std::memset(p, 0, page_bytes);
  std::memcpy(p, superblock_magic, 8);
  put32(p + 8, format_version);
  std::memcpy(p + 16, sb.uuid.data(), 16);
  put32(p + 32, sb.volume_index);
  put32(p + 36, sb.volume_count);
  put64(p + 40, sb.block_bytes);
  put64(p + 48, sb.slot_bytes);
  put64(p + 56, sb.slots);
  put64(p + 64, sb.slot_offset);
  put64(p + 72, sb.checkpoint_offset);
  put64(p + 80, sb.checkpoint_bytes);
  put64(p + 88, sb.capacity_bytes);
  put64(p + 96, sb.namespace_hash);
  const std::size_t n = std::min(sb.name_space.size(), max_namespace_bytes);
  put32(p + 104, static_cast<std::uint32_t>(n));
  put64(p + 112, sb.created_unix_ns);
  std::memcpy(p + 128, sb.name_space.data(), n);
  put32(p + 12, crc_without(p, page_bytes, 12));
}

page_kind decode_superblock(std::span<const std::uint8_t, page_bytes> page, superblock& sb) noexcept {
  const std::uint8_t* p = page.data();
  if (all_zero(p, page_bytes)) return page_kind::blank;
  if (std::memcmp(p, superblock_magic, 8) != 0) return page_kind::foreign;
  if (get32(p + 12) != crc_without(p, page_bytes, 12)) return page_kind::damaged;
  if (get32(p + 8) > format_version) return page_kind::newer;
  if (get32(p + 8) != format_version) return page_kind::damaged;
  std::memcpy(sb.uuid.data(), p + 16, 16);
  sb.volume_index = get32(p + 32);
  sb.volume_count = get32(p + 36);
  sb.block_bytes = get64(p + 40);
  sb.slot_bytes = get64(p + 48);
  sb.slots = get64(p + 56);
  sb.slot_offset = get64(p + 64);
  sb.checkpoint_offset = get64(p + 72);
  sb.checkpoint_bytes = get64(p + 80);
  sb.capacity_bytes = get64(p + 88);
  sb.namespace_hash = get64(p + 96);
  const std::uint32_t n = get32(p + 104);
  sb.created_unix_ns = get64(p + 112);
  if (n > max_namespace_bytes || sb.volume_count == 0 || sb.volume_index >= sb.volume_count ||
      sb.block_bytes == 0 || sb.block_bytes > max_block_bytes || sb.slots == 0) {
    return page_kind::damaged;
  }
  sb.name_space.assign(reinterpret_cast<const char*>(p + 128), n);
  // The geometry must be the one this format computes: anything else was not written by it.
  const layout l = make_layout(sb.block_bytes, sb.slots);
  if (l.slot_bytes != sb.slot_bytes || l.slot_offset != sb.slot_offset || l.checkpoint_offset != sb.checkpoint_offset ||
      l.checkpoint_bytes != sb.checkpoint_bytes || sb.namespace_hash != namespace_hash(sb.name_space)) {
    return page_kind::damaged;
  }
  return page_kind::ok;
}

// Block header fields: 0 magic, 8 version, 12 crc, 16 uuid, 32 namespace hash, 40 sequence, 48 volume,
// 56 slot, 64 data bytes, 72 data crc, 76 key kind, 77 key size, 80 key (32 bytes), 112..128 zero.
void encode_header(const block_header& h, std::uint8_t* p) noexcept {
  std::memset(p, 0, header_bytes);
  std::memcpy(p, header_magic, 8);
  put32(p + 8, format_version);
  std::memcpy(p + 16, h.uuid.data(), 16);
  put64(p + 32, h.namespace_hash);
  put64(p + 40, h.sequence);
  put32(p + 48, h.volume);
  put64(p + 56, h.slot);
  put64(p + 64, h.data_bytes);
  put32(p + 72, h.data_crc);
  put_key(p + 76, p + 80, h.k);
  put32(p + 12, crc_without(p, header_bytes, 12));
}

bool decode_header(const std::uint8_t* p, block_header& h) noexcept {
  if (std::memcmp(p, header_magic, 8) != 0 || get32(p + 8) != format_version) return false;
  if (get32(p + 12) != crc_without(p, header_bytes, 12)) return false;
  if (!all_zero(p + 52, 4) || !all_zero(p + 78, 2) || !all_zero(p + 112, 16)) return false;
  std::memcpy(h.uuid.data(), p + 16, 16);
  h.namespace_hash = get64(p + 32);
  h.sequence = get64(p + 40);
  h.volume = get32(p + 48);
  h.slot = get64(p + 56);
  h.data_bytes = get64(p + 64);
  h.data_crc = get32(p + 72);
  return get_key(p + 76, p + 80, h.k);
}

// Checkpoint entry: 0 data crc, 4 key kind, 5 key size, 6..8 zero, 8 sequence, 16 key (32 bytes).
void encode_entry(const checkpoint_entry& e, std::uint8_t* p) noexcept {
  std::memset(p, 0, checkpoint_entry_bytes);
  if (e.k.type() == key::kind::none) return;
  put32(p, e.data_crc);
  put_key(p + 4, p + 16, e.k);
  put64(p + 8, e.sequence);
}

bool decode_entry(const std::uint8_t* p, checkpoint_entry& e) noexcept {
  if (p[4] == 0) {
    e = {};
    return all_zero(p, checkpoint_entry_bytes);
  }
  if (p[6] != 0 || p[7] != 0) return false;
  e.data_crc = get32(p);
  e.sequence = get64(p + 8);
  return get_key(p + 4, p + 16, e.k);
}

// Checkpoint header: 0 magic, 8 version, 12 crc, 16 uuid, 32 generation, 40 next sequence, 48 slots,
// 56 window count, 64 body bytes, 72 body crc, 76 clean.
void encode_checkpoint_header(const checkpoint_header& h, std::uint8_t* p) noexcept {
  std::memset(p, 0, page_bytes);
  std::memcpy(p, checkpoint_magic, 8);
  put32(p + 8, format_version);
  std::memcpy(p + 16, h.uuid.data(), 16);
  put64(p + 32, h.generation);
  put64(p + 40, h.next_sequence);
  put64(p + 48, h.slots);
  put64(p + 56, h.window_count);
  put64(p + 64, h.body_bytes);
  put32(p + 72, h.body_crc);
  put32(p + 76, h.clean ? 1u : 0u);
  put64(p + 80, h.namespace_hash);
  put32(p + 12, crc_without(p, checkpoint_header_bytes, 12));
}

bool decode_checkpoint_header(const std::uint8_t* p, checkpoint_header& h) noexcept {
  if (std::memcmp(p, checkpoint_magic, 8) != 0 || get32(p + 8) != format_version) return false;
  if (get32(p + 12) != crc_without(p, checkpoint_header_bytes, 12)) return false;
  std::memcpy(h.uuid.data(), p + 16, 16);
  h.generation = get64(p + 32);
  h.next_sequence = get64(p + 40);
  h.slots = get64(p + 48);
  h.window_count = get64(p + 56);
  h.body_bytes = get64(p + 64);
  h.body_crc = get32(p + 72);
  const std::uint32_t clean = get32(p + 76);
  if (clean > 1) return false;
  h.clean = clean == 1;
  h.namespace_hash = get64(p + 80);
  return h.window_count <= h.slots &&
         h.body_bytes == h.slots * checkpoint_entry_bytes + h.window_count * window_entry_bytes;
}

}  // namespace gdskit::kv::detail
