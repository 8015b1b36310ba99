// SHA-256 against the FIPS 180-4 / NIST example vectors, and streaming in uneven pieces.
#include "formats/sha256.hpp"

#include <gtest/gtest.h>

#include <string>

#include "test_support.hpp"

using gdskit::formats::sha256;

namespace {

std::string hex_of(const std::string& s) { return sha256::hex(s.data(), s.size()); }

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                   "mnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(hex_of("The quick brown fox jumps over the lazy dog"),
            "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592");
}

TEST(Sha256, OneMillionA) {
  sha256 h;
  std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk.data(), chunk.size());
  EXPECT_EQ(h.finish_hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries (55, 56, 63, 64, 65 bytes) streamed in pieces equal one-shot digests.
TEST(Sha256, StreamingMatchesOneShot) {
  auto data = gdskit::test::random_bytes(4099, 7);
  for (std::size_t n : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 1000u, 4099u}) {
    const std::string want = sha256::hex(data.data(), n);
    for (std::size_t piece : {1u, 3u, 63u, 64u, 65u, 500u}) {
      sha256 h;
      for (std::size_t at = 0; at < n; at += piece) h.update(data.data() + at, std::min(piece, n - at));
      EXPECT_EQ(h.finish_hex(), want) << "n=" << n << " piece=" << piece;
    }
  }
}

TEST(Sha256, ResetStartsOver) {
  sha256 h;
  h.update("xyz", 3);
  (void)h.finish();
  h.reset();
  h.update("abc", 3);
  EXPECT_EQ(h.finish_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
