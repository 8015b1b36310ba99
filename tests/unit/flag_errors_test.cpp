// The number checks every numeric flag gets: what they accept, what they pass on to the parser, and their words.
#include <gtest/gtest.h>

#include <string>

#include "tools/flag_errors.hpp"

namespace gdskit {
namespace {

// The validator's message for `text` (empty: accepted), and the text it passes on.
std::string check(const CLI::Validator& v, std::string& text) { return v(text); }

TEST(whole_number, takes_decimal_within_its_range_and_passes_it_on_plainly) {
  const CLI::Validator v = tools::whole_number(0, 100);
  std::string t = "007";
  EXPECT_EQ(check(v, t), "");
  EXPECT_EQ(t, "7") << "a leading zero must not reach the parser, which reads it as octal";
  t = "+5";
  EXPECT_EQ(check(v, t), "");
  EXPECT_EQ(t, "5");
  t = "-0";
  EXPECT_EQ(check(v, t), "");
  EXPECT_EQ(t, "0");
  t = "101";
  EXPECT_EQ(check(v, t), "'101' is out of range (0 .. 100)");
  t = "0x10";
  EXPECT_EQ(check(v, t), "'0x10' is not a whole number");
}

TEST(whole_number, a_negative_zero_is_below_a_range_that_starts_above_zero) {
  const CLI::Validator v = tools::whole_number(1, 10);
  std::string t = "-0";
  EXPECT_EQ(check(v, t), "'-0' is out of range (1 .. 10)");
  t = "0";
  EXPECT_EQ(check(v, t), "'0' is out of range (1 .. 10)");
  t = "1";
  EXPECT_EQ(check(v, t), "");
}

TEST(whole_number, negative_bounds_hold_to_the_last_value) {
  const CLI::Validator v = tools::whole_number<std::int64_t>();
  std::string t = "-9223372036854775808";
  EXPECT_EQ(check(v, t), "");
  EXPECT_EQ(t, "-9223372036854775808");
  t = "-9223372036854775809";
  EXPECT_NE(check(v, t), "");
  const CLI::Validator w = tools::whole_number(-3, 3);
  t = "-4";
  EXPECT_EQ(check(w, t), "'-4' is out of range (-3 .. 3)");
  t = "-3";
  EXPECT_EQ(check(w, t), "");
}

}  // namespace
}  // namespace gdskit
