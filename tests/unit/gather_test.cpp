// The numpy type strings row gathers take: one parser for .npy headers and the Python package's row files.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gdskit/error.hpp"
#include "gdskit/gather.hpp"
#include "test_support.hpp"

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


// The header numpy.lib.format writes (version 1.0): magic, version, a little-endian length, then the dictionary
// padded with spaces to a multiple of 64 bytes and ended by a newline.
std::vector<std::uint8_t> npy_file(const std::string& dict, const std::vector<std::uint8_t>& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  const std::string magic = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size() & 0xff) +
                            static_cast<char>(header.size() >> 8);
  std::string text = magic + header;
  text.append(reinterpret_cast<const char*>(data.data()), data.size());
  return {text.begin(), text.end()};
}

std::error_code code_of(const std::function<void()>& fn, std::string* what = nullptr) {
  try {
    fn();
  } catch (const error& e) {
    if (what != nullptr) *what = e.what();
    return e.code();
  }
  return {};
}

TEST(gather, rows_of_an_npy_file_in_any_order_with_duplicates) {
  test::temp_dir dir;
  constexpr std::size_t rows = 1000, row = 3 * 4;  // shape (1000, 3), float32: 12-byte rows, not page aligned
  const auto data = test::random_bytes(rows * row, 3);
  test::write_file(dir / "a.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 3), }", data));
  file_handle f(dir / "a.npy", open_mode::read);
  const npy_header h = read_npy_header(f);
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_EQ(h.shape, (std::vector<std::uint64_t>{1000, 3}));
  EXPECT_EQ(h.data_offset_bytes % 64, 0u);
  const row_layout l = h.rows();
  EXPECT_EQ(l.row_bytes, row);
  EXPECT_EQ(l.nrows, rows);
  const std::vector<std::int64_t> idx = {999, 0, 500, 500, 1, 998, 0};
  std::vector<std::uint8_t> out(idx.size() * row + 5, 0xEE);
  const batch_result r = gather_rows(f, l, idx, buffer_view::host(out.data(), idx.size() * row));
  ASSERT_TRUE(r.ok());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    EXPECT_EQ(0, std::memcmp(out.data() + k * row, data.data() + static_cast<std::size_t>(idx[k]) * row, row)) << k;
  }
  EXPECT_EQ(out.back(), 0xEE);  // nothing past the rows
}

TEST(gather, bad_arguments_are_refused_before_any_io) {
  test::temp_dir dir;
  const auto data = test::random_bytes(100 * 8, 4);
  test::write_file(dir / "raw", data);
  file_handle f(dir / "raw", open_mode::read);
  const row_layout l{0, 8, 100};
  std::vector<std::uint8_t> out(3 * 8, 0xEE);
  std::string what;
  const std::vector<std::int64_t> ok = {1, 2, 3};
  EXPECT_EQ(code_of([&] { gather_rows(f, l, ok, buffer_view::host(out.data(), 3 * 8 - 1)); }, &what),
            std::errc::invalid_argument);
  EXPECT_NE(what.find("destination holds 23 bytes"), std::string::npos) << what;
  const std::vector<std::int64_t> past = {1, 100, 2}, negative = {-1};
  EXPECT_EQ(code_of([&] { gather_rows(f, l, past, buffer_view::host(out.data(), out.size())); }, &what),
            std::errc::invalid_argument);
  EXPECT_NE(what.find("index 100 at position 1"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { gather_rows(f, l, negative, buffer_view::host(out.data(), out.size())); }),
            std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { gather_rows(f, {0, 0, 100}, ok, buffer_view::host(out.data(), out.size())); }),
            std::errc::invalid_argument);  // rows of 0 bytes
  // A layout whose rows would end past the largest file offset: their offsets would wrap to the file's start.
  const row_layout wraps{(std::uint64_t{1} << 63) - 8, 8, 100};
  EXPECT_EQ(code_of([&] { gather_rows(f, wraps, ok, buffer_view::host(out.data(), out.size())); }, &what),
            std::errc::invalid_argument);
  EXPECT_NE(what.find("past the largest file offset"), std::string::npos) << what;
  const row_layout wraps_64{~std::uint64_t{0} - 7, 8, 2};  // row 1 would be read from byte 0
  const std::vector<std::int64_t> one = {1};
  what.clear();
  EXPECT_EQ(code_of([&] { gather_rows(f, wraps_64, one, buffer_view::host(out.data(), out.size())); }, &what),
            std::errc::invalid_argument);
  EXPECT_NE(what.find("past the largest file offset"), std::string::npos) << what;
  EXPECT_EQ(std::vector<std::uint8_t>(out.size(), 0xEE), out);  // nothing was read
}

TEST(gather, a_short_or_malformed_npy_file_is_refused) {
  test::temp_dir dir;
  auto short_file = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 3), }", test::random_bytes(100, 5));
  test::write_file(dir / "short.npy", short_file);
  file_handle s(dir / "short.npy", open_mode::read);
  std::string what;
  EXPECT_EQ(code_of([&] { read_npy_header(s); }, &what), std::errc::bad_message);
  EXPECT_NE(what.find("shorter than"), std::string::npos) << what;
  test::write_file(dir / "fortran.npy", npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                                                 test::random_bytes(24, 6)));
  file_handle fo(dir / "fortran.npy", open_mode::read);
  EXPECT_EQ(code_of([&] { read_npy_header(fo); }), std::errc::not_supported);
  test::write_file(dir / "huge.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                                              {}));
  file_handle hu(dir / "huge.npy", open_mode::read);
  EXPECT_EQ(code_of([&] { read_npy_header(hu); }), std::errc::bad_message);
  test::write_file(dir / "not.npy", std::vector<std::uint8_t>(200, 'x'));
  file_handle no(dir / "not.npy", open_mode::read);
  EXPECT_EQ(code_of([&] { read_npy_header(no); }), std::errc::bad_message);
}

}  // namespace
}  // namespace gdskit
