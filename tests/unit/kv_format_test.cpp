// The block store's on-disk format: layout arithmetic within the capacity, superblock / block header /
// checkpoint round trips, and every single-byte corruption of a header detected. Keys: identity and limits.
#include <gtest/gtest.h>

#include <cerrno>
#include <random>
#include <vector>

#include "gdskit/error.hpp"
#include "kv/format.hpp"

namespace gdskit::kv::detail {
namespace {

TEST(kv_format, layout_fits_the_budget_and_aligns) {
  for (std::uint64_t block : {1ull, 4096ull, 5000ull, 65536ull, 2ull << 20, 8ull << 20}) {
    for (std::uint64_t budget : {64ull << 10, 1ull << 20, 100ull << 20, 1ull << 30, 3ull << 30, 1ull << 60}) {
      const std::uint64_t s = slots_within(block, budget);
      if (s == 0) {
        EXPECT_GT(make_layout(block, 1).budget_bytes(), budget);
        continue;
      }
      const layout l = make_layout(block, s);
      EXPECT_LE(l.budget_bytes(), budget) << block << " " << budget;
      EXPECT_GT(make_layout(block, s + 1).budget_bytes(), budget) << "one more slot would still fit";
      EXPECT_EQ(l.slot_bytes % page_bytes, 0u);
      EXPECT_EQ(l.slot_offset % page_bytes, 0u);
      EXPECT_EQ(l.header_offset % page_bytes, 0u);
      EXPECT_GE(l.header_offset, block);
      EXPECT_GE(l.checkpoint_bytes, page_bytes + s * (checkpoint_entry_bytes + window_entry_bytes));
    }
  }
}

key sample_key(std::mt19937_64& rng) {
  std::uint8_t b[32];
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  switch (rng() % 3) {
    case 0: return key::from_bytes(std::span<const std::uint8_t>(b, 1 + rng() % 32));
    case 1: return key::from_int(static_cast<std::int64_t>(rng()));
    default: return key::from_magnitude(std::span<const std::uint8_t>(b, 32), rng() % 2 == 0);
  }
}

TEST(kv_format, keys_identity_and_limits) {
  EXPECT_NE(key::from_bytes(std::string_view("\x01", 1)), key::from_int(1));
  EXPECT_EQ(key::from_int(5), key::from_uint(5));
  EXPECT_NE(key::from_int(-5), key::from_int(5));
  EXPECT_EQ(key::from_int(0), key::from_magnitude({}, true));  // no negative zero
  EXPECT_EQ(key::from_int(INT64_MIN).to_string(), "int:-0x8000000000000000");
  EXPECT_EQ(key::from_bytes(std::string_view("ab")).to_string(), "0x6162");
  std::uint8_t big[33] = {};
  big[32] = 1;
  try {
    key::from_magnitude(big, false);
    FAIL() << "a 2^256 integer key was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
  try {
    key::from_bytes(std::span<const std::uint8_t>(big, 33));
    FAIL() << "a 33-byte key was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
  EXPECT_THROW(key::from_bytes(std::string_view()), error);
  big[32] = 0;  // zero bytes at the top of a magnitude do not count
  EXPECT_EQ(key::from_magnitude(big, false), key::from_int(0));
}

TEST(kv_format, superblock_round_trip_and_damage) {
  superblock sb;
  for (std::size_t i = 0; i < 16; ++i) sb.uuid[i] = static_cast<std::uint8_t>(i * 7);
  const layout l = make_layout(65536, 123);
  sb.volume_index = 1;
  sb.volume_count = 2;
  sb.block_bytes = l.block_bytes;
  sb.slot_bytes = l.slot_bytes;
  sb.slots = l.slots;
  sb.slot_offset = l.slot_offset;
  sb.checkpoint_offset = l.checkpoint_offset;
  sb.checkpoint_bytes = l.checkpoint_bytes;
  sb.capacity_bytes = 1ull << 30;
  sb.name_space = "llama-3-8b/fp16/rank0\n\xff";
  sb.namespace_hash = namespace_hash(sb.name_space);
  std::array<std::uint8_t, page_bytes> page{};
  encode_superblock(sb, page);
  superblock back;
  ASSERT_EQ(decode_superblock(page, back), page_kind::ok);
  EXPECT_EQ(back.uuid, sb.uuid);
  EXPECT_EQ(back.name_space, sb.name_space);
  EXPECT_EQ(back.slots, 123u);
  EXPECT_EQ(back.capacity_bytes, sb.capacity_bytes);

  std::array<std::uint8_t, page_bytes> blank{};
  EXPECT_EQ(decode_superblock(blank, back), page_kind::blank);
  std::array<std::uint8_t, page_bytes> other{};
  other[0] = 0x7f;
  other[1] = 'E';
  EXPECT_EQ(decode_superblock(other, back), page_kind::foreign);
  for (std::size_t at : {8u, 20u, 40u, 56u, 96u, 130u, 4000u}) {
    auto bad = page;
    bad[at] ^= 0x10;
    EXPECT_EQ(decode_superblock(bad, back), page_kind::damaged) << "byte " << at;
  }
}

TEST(kv_format, block_header_detects_every_byte_flip) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; ++round) {
    block_header h;
    for (auto& b : h.uuid) b = static_cast<std::uint8_t>(rng());
    h.namespace_hash = rng();
    h.sequence = rng();
    h.volume = static_cast<std::uint32_t>(rng() % 8);
    h.slot = rng() % 1000000;
    h.data_bytes = 1 + rng() % (1u << 30);
    h.data_crc = static_cast<std::uint32_t>(rng());
    h.k = sample_key(rng);
    std::vector<std::uint8_t> page(page_bytes, 0);
    encode_header(h, page.data());
    block_header back;
    ASSERT_TRUE(decode_header(page.data(), back));
    EXPECT_EQ(back.k, h.k);
    EXPECT_EQ(back.sequence, h.sequence);
    EXPECT_EQ(back.data_crc, h.data_crc);
    EXPECT_EQ(back.slot, h.slot);
    for (std::size_t at = 0; at < 128; ++at) {
      auto bad = page;
      bad[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      EXPECT_FALSE(decode_header(bad.data(), back)) << "flip at byte " << at << " went unnoticed";
    }
  }
}

TEST(kv_format, checkpoint_header_and_entries) {
  checkpoint_header h;
  h.uuid[3] = 9;
  h.generation = 77;
  h.next_sequence = 1234;
  h.slots = 10;
  h.window_count = 3;
  h.body_bytes = 10 * checkpoint_entry_bytes + 3 * window_entry_bytes;
  h.body_crc = 0xdeadbeef;
  h.clean = false;
  h.namespace_hash = 0x0123456789abcdefull;
  std::vector<std::uint8_t> page(page_bytes);
  encode_checkpoint_header(h, page.data());
  checkpoint_header back;
  ASSERT_TRUE(decode_checkpoint_header(page.data(), back));
  EXPECT_EQ(back.generation, 77u);
  EXPECT_EQ(back.window_count, 3u);
  EXPECT_EQ(back.namespace_hash, h.namespace_hash);
  page[85] ^= 1;  // in the namespace hash: covered by the header's CRC
  EXPECT_FALSE(decode_checkpoint_header(page.data(), back));
  page[85] ^= 1;
  page[40] ^= 1;
  EXPECT_FALSE(decode_checkpoint_header(page.data(), back));

  std::mt19937_64 rng(9);
  for (int i = 0; i < 100; ++i) {
    checkpoint_entry e{static_cast<std::uint32_t>(rng()), rng(), sample_key(rng)};
    std::uint8_t buf[checkpoint_entry_bytes];
    encode_entry(e, buf);
    checkpoint_entry d;
    ASSERT_TRUE(decode_entry(buf, d));
    EXPECT_EQ(d.k, e.k);
    EXPECT_EQ(d.sequence, e.sequence);
    EXPECT_EQ(d.data_crc, e.data_crc);
  }
  std::uint8_t empty[checkpoint_entry_bytes] = {};
  checkpoint_entry d;
  EXPECT_TRUE(decode_entry(empty, d));
  EXPECT_EQ(d.k.type(), key::kind::none);
  empty[20] = 1;  // key bytes without a kind: malformed
  EXPECT_FALSE(decode_entry(empty, d));
}

// A block written in pieces is summed from the pieces' sums: the combination equals the sum of the whole for
// every cut, including empty pieces, and differs when a piece's sum is wrong.
TEST(kv_format, crc32c_of_pieces_combines_to_the_whole) {
  std::mt19937_64 rng(5);
  std::vector<std::uint8_t> d(300000);
  for (auto& b : d) b = static_cast<std::uint8_t>(rng());
  const std::uint32_t whole = crc32c(d.data(), d.size());
  std::vector<std::size_t> cuts = {0, 1, 7, 8, 4096, 65536, d.size() - 1, d.size()};
  for (int i = 0; i < 20; ++i) cuts.push_back(rng() % d.size());
  for (std::size_t cut : cuts) {
    const std::uint32_t a = crc32c(d.data(), cut), b = crc32c(d.data() + cut, d.size() - cut);
    EXPECT_EQ(crc32c_combine(a, b, d.size() - cut), whole) << "cut " << cut;
    EXPECT_NE(crc32c_combine(a ^ 1u, b, d.size() - cut), whole) << "cut " << cut;
  }
  // Three pieces, as a block of 2.5 pieces is written.
  const std::size_t p = 100000;
  std::uint32_t c = crc32c(d.data(), p);
  c = crc32c_combine(c, crc32c(d.data() + p, p), p);
  c = crc32c_combine(c, crc32c(d.data() + 2 * p, d.size() - 2 * p), d.size() - 2 * p);
  EXPECT_EQ(c, whole);
}

}  // namespace
}  // namespace gdskit::kv::detail
