// CRC32C: known check values, the two implementations agreeing on random data at every alignment and length
// (across the three-stream strides), and chaining (crc of A then B equals crc of AB).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gdskit/kv.hpp"
#include "kv/crc32c.hpp"

namespace gdskit::kv {
namespace {

TEST(kv_crc32c, check_values) {
  // The standard check value of CRC-32C, and values of RFC 3720 (iSCSI) appendix B.4.
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(detail::crc32c_portable(digits.data(), digits.size(), 0), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(kv_crc32c, implementations_agree_on_random_data) {
  if (!detail::crc32c_hardware()) GTEST_SKIP() << "this CPU has no crc32 instruction: only the portable one runs";
  std::mt19937_64 rng(11);
  std::vector<unsigned char> buf(200000 + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  // Lengths around the stride boundaries (3 x 256, 3 x 8192) and random ones, at every alignment mod 8.
  std::vector<std::size_t> lengths = {0, 1, 7, 8, 9, 255, 767, 768, 769, 1000, 24575, 24576, 24577, 65536, 200000};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % 200000);
  for (std::size_t n : lengths) {
    for (std::size_t off = 0; off < 8; ++off) {
      const std::uint32_t seed = static_cast<std::uint32_t>(rng());
      ASSERT_EQ(detail::crc32c_instruction(buf.data() + off, n, seed), detail::crc32c_portable(buf.data() + off, n, seed))
          << "length " << n << " offset " << off;
    }
  }
}

TEST(kv_crc32c, chains) {
  std::mt19937_64 rng(3);
  std::vector<unsigned char> buf(100000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c(buf.data(), buf.size());
  for (int i = 0; i < 20; ++i) {
    const std::size_t cut = rng() % buf.size();
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, crc32c(buf.data(), cut)), whole) << "cut " << cut;
  }
  // One flipped bit anywhere changes it.
  for (int i = 0; i < 20; ++i) {
    const std::size_t at = rng() % buf.size();
    const auto mask = static_cast<unsigned char>(1u << (rng() % 8));
    buf[at] ^= mask;
    EXPECT_NE(crc32c(buf.data(), buf.size()), whole) << "flip at " << at;
    buf[at] ^= mask;
  }
}

}  // namespace
}  // namespace gdskit::kv
