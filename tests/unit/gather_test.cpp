// The numpy type strings row gathers take: one parser for .npy headers and the Python package's row files.
#include <gtest/gtest.h>

#include "gdskit/gather.hpp"

namespace gdskit {
namespace {

TEST(gather, numpy_type_strings) {
  const auto f4 = parse_npy_type("<f4");
  ASSERT_TRUE(f4);
  EXPECT_EQ(f4->byte_order, '<');
  EXPECT_EQ(f4->kind, 'f');
  EXPECT_EQ(f4->itemsize, 4u);
  EXPECT_TRUE(f4->numeric());
  EXPECT_EQ(parse_npy_type(">c16")->itemsize, 16u);
  EXPECT_EQ(parse_npy_type("|b1")->kind, 'b');
  ASSERT_TRUE(parse_npy_type("|S10"));
  EXPECT_FALSE(parse_npy_type("|S10")->numeric());
  EXPECT_FALSE(parse_npy_type("|V8")->numeric());
  std::string why;
  for (const char* bad : {"", "f4", "float32", "<O8", "<U5", "<M8[ns]", "<f", "<f0", "<f1234567890", "<f4x"}) {
    why.clear();
    EXPECT_FALSE(parse_npy_type(bad, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  parse_npy_type("<f0", &why);
  EXPECT_EQ(why, "dtype has item size 0");
  parse_npy_type("\x1b[31m", &why);
  EXPECT_EQ(why.find('\x1b'), std::string::npos) << why;  // shown escaped
}

}  // namespace
}  // namespace gdskit
