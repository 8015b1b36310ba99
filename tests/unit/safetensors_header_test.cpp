// safetensors header parsing and validation: every rejection names its cause with EBADMSG.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "test_support.hpp"

namespace st = gdskit::safetensors;

namespace {

// 8-byte little-endian length + JSON text (padded with spaces like the reference writer) + data bytes.
std::vector<std::uint8_t> make_file(const std::string& json, std::size_t data_nbytes, bool pad = true,
                                    std::uint64_t length_override = 0) {
  std::string h = json;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::uint64_t len = length_override ? length_override : h.size();
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(len >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.resize(out.size() + data_nbytes, 0xAB);
  return out;
}

st::header parse(const std::vector<std::uint8_t>& f) { return st::parse_header(f.data(), f.size(), f.size(), "t.safetensors"); }

int parse_errno(const std::vector<std::uint8_t>& f) {
  try {
    parse(f);
  } catch (const gdskit::error& e) {
    EXPECT_NE(std::string(e.what()).find("t.safetensors"), std::string::npos) << e.what();
    return e.code().value();
  }
  return 0;
}

std::string fmt_json(const char* dtype, unsigned bits) {
  return std::string(R"({"t":{"dtype":")") + dtype + R"(","shape":[8],"data_offsets":[0,)" + std::to_string(bits) + "]}}";
}

int parse_json_errno(const std::string& json, std::size_t data_nbytes) { return parse_errno(make_file(json, data_nbytes)); }

TEST(SafetensorsHeader, ParsesTensorsMetadataAndOffsets) {
  auto f = make_file(R"({"__metadata__":{"format":"pt","note":"x"},
    "b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},
    "a":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})", 32);
  auto h = parse(f);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by offset
  EXPECT_TRUE(h.tensors[0].shape.empty());
  EXPECT_EQ(h.tensors[0].numel(), 1u);
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, st::dtype::F32);
  EXPECT_EQ(h.tensors[1].shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].nbytes(), 24u);
  EXPECT_EQ(h.data_offset_bytes, 8 + h.json_nbytes);
  EXPECT_EQ(h.tensors[1].file_offset_bytes, h.data_offset_bytes + 8);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.find("b"), &h.tensors[1]);
  EXPECT_EQ(h.find("zz"), nullptr);
}

TEST(SafetensorsHeader, EveryDtypeHasItsSize) {
  struct row { const char* name; unsigned bits; };
  const row rows[] = {{"BOOL", 8},  {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
                      {"F4", 4},    {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"I16", 16}, {"U16", 16}, {"F16", 16},
                      {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64},
                      {"I64", 64},  {"U64", 64}};
  for (const auto& r : rows) {
    auto t = st::parse_dtype(r.name);
    ASSERT_TRUE(t) << r.name;
    EXPECT_EQ(st::bits_of(*t), r.bits) << r.name;
    EXPECT_EQ(st::to_string(*t), r.name);
    // 8 elements of each: 8 x bits / 8 bytes.
    auto f = make_file(fmt_json(r.name, r.bits), r.bits);
    auto h = parse(f);
    EXPECT_EQ(h.tensors.at(0).nbytes(), r.bits) << r.name;
  }
  EXPECT_FALSE(st::parse_dtype("F32 "));
  EXPECT_FALSE(st::parse_dtype("f32"));
}

TEST(SafetensorsHeader, EmptyAndZeroDimTensors) {
  auto h = parse(make_file(R"({"e":{"dtype":"F16","shape":[0,7],"data_offsets":[4,4]},
      "s":{"dtype":"U32","shape":[],"data_offsets":[0,4]}})", 4));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.find("e")->nbytes(), 0u);
  EXPECT_EQ(h.find("e")->numel(), 0u);
  EXPECT_EQ(h.find("s")->nbytes(), 4u);
  // An empty header (no tensors) is a valid file.
  EXPECT_TRUE(parse(make_file("{}", 0)).tensors.empty());
}

TEST(SafetensorsHeader, PackedDtypesMustBeWholeBytes) {
  EXPECT_EQ(parse_json_errno(R"({"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2), 0);
  EXPECT_EQ(parse_json_errno(R"({"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), EBADMSG);
  EXPECT_EQ(parse_json_errno(R"({"q":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}})", 3), 0);
  EXPECT_EQ(parse_json_errno(R"({"q":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}})", 2), EBADMSG);
}

TEST(SafetensorsHeader, OffsetsPast4GiBAre64Bit) {
  // The header is checked against the file size, not the bytes in memory: a 5 GiB file needs no 5 GiB buffer.
  const std::uint64_t four_g = std::uint64_t{1} << 32;
  auto f = make_file(R"({"big":{"dtype":"U8","shape":[16],"data_offsets":[4294967296,4294967312]},
                         "lo":{"dtype":"U8","shape":[4294967296],"data_offsets":[0,4294967296]}})", 0);
  const std::uint64_t file_size = f.size() + four_g + 16;
  auto h = st::parse_header(f.data(), f.size(), file_size, "big.safetensors");
  EXPECT_EQ(h.find("big")->begin_bytes, four_g);
  EXPECT_EQ(h.find("big")->file_offset_bytes, h.data_offset_bytes + four_g);
  EXPECT_EQ(h.find("lo")->nbytes(), four_g);
  try {
    st::parse_header(f.data(), f.size(), file_size - 1, "big.safetensors");
    FAIL() << "offsets past the end of the file were accepted";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EBADMSG);
  }
}

TEST(SafetensorsHeader, RejectsMalformedHeaders) {
  // Each case: the file and why it is wrong.
  struct bad_case { std::string json; std::size_t data; const char* why; };
  const bad_case cases[] = {
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6, "overlap"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4, "same range"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3, "past the end"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}})", 4, "end before begin"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8, "size mismatch"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,17]}})", 17, "size mismatch (larger)"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2, "duplicate name"},
      {R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "duplicate key"},
      {R"({"__metadata__":{"k":"1","k":"2"}})", 0, "duplicate metadata key"},
      {R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,1]}})", 1, "unknown dtype"},
      {R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1, "dtype not a string"},
      {R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "negative dim"},
      {R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1, "fractional dim"},
      {R"({"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}})", 1, "float dim"},
      {R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", 1, "string dim"},
      {R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1, "nested dim"},
      {R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1, "shape not an array"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1, "one offset"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2, "three offsets"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1, "negative offset"},
      {R"({"a":{"dtype":"U8","shape":[1]}})", 1, "no offsets"},
      {R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1, "no dtype"},
      {R"({"a":[1]})", 1, "tensor not an object"},
      {R"({"__metadata__":{"k":1}})", 0, "metadata value not a string"},
      {R"({"__metadata__":[]})", 0, "metadata not an object"},
      {R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})", 0, "shape overflow"},
      {R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]}})", 1, "dim beyond 64 bits"},
      {R"({"a":{"dtype":"U8","shape":[0,18446744073709551615,18446744073709551615],"data_offsets":[0,0]}})", 0,
       "empty tensor with dims above 2^63-1"},
      {R"({"a":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0, "dim of 2^63"},
      {R"([])", 0, "not an object"},
      {R"({"a":222222222E2222222222})", 0, "number too large for a double (out_of_range, found by fuzzing)"},
      {R"({"a":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}})", 1, "dim too large for a double"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x)", 1, "trailing garbage"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}{})", 1, "two objects"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})", 1, "truncated JSON"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],}})", 1, "trailing comma"},
      {R"({"a":{"x":{"y":{}}}})", 0, "too deep"},
  };
  for (const auto& c : cases) EXPECT_EQ(parse_json_errno(c.json, c.data), EBADMSG) << c.why << ": " << c.json;
}

TEST(SafetensorsHeader, RejectsInvalidUtf8) {
  for (std::string bad : {std::string("\xff"), std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                          std::string("\xf4\x90\x80\x80"), std::string("\xe2\x82")}) {
    std::string json = R"({"a)" + bad + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
    EXPECT_EQ(parse_json_errno(json, 1), EBADMSG);
  }
  // Valid multi-byte names pass.
  EXPECT_EQ(parse_json_errno("{\"w\xc3\xa9ight\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],"
                             "\"data_offsets\":[0,1]}}", 1), 0);
}

TEST(SafetensorsHeader, RejectsBadLengthField) {
  // Too short for the length.
  std::vector<std::uint8_t> tiny = {1, 0, 0};
  EXPECT_EQ(parse_errno(tiny), EBADMSG);
  // Length above the 100 MiB limit.
  EXPECT_EQ(parse_errno(make_file("{}", 0, true, st::max_header_bytes + 1)), EBADMSG);
  // Length past the end of the file.
  EXPECT_EQ(parse_errno(make_file("{}", 0, true, 4096)), EBADMSG);
  // A NUL-padded header is not JSON whitespace.
  auto f = make_file("{}", 0, false);
  f[0] = 8;
  f.insert(f.end(), 6, 0);
  EXPECT_EQ(parse_errno(f), EBADMSG);
  // Space padding is accepted; so is an empty header that is only "{}".
  EXPECT_EQ(parse_errno(make_file("{}", 0, true)), 0);
  // Must start with '{'.
  EXPECT_EQ(parse_errno(make_file(" {}", 0, false)), EBADMSG);
}

// Another kind of file is called what it is, not measured by a "header length" read from its first bytes.
TEST(SafetensorsHeader, AnotherKindOfFileIsNotASafetensorsFile) {
  gdskit::test::temp_dir dir;
  const std::string text = "hello world, this is not a safetensors file at all\n";
  for (std::size_t n : {std::size_t{9}, std::size_t{16}, text.size()}) {
    SCOPED_TRACE(n);
    std::vector<std::uint8_t> f(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n));
    gdskit::test::write_file(dir / "junk.bin", f);
    for (bool from_file : {false, true}) {
      try {
        if (from_file) {
          st::read_header(dir / "junk.bin");
        } else {
          parse(f);
        }
        FAIL() << "parsed";
      } catch (const gdskit::error& e) {
        EXPECT_EQ(e.code().value(), EBADMSG);
        const std::string what = e.what();
        EXPECT_NE(what.find("not a safetensors file"), std::string::npos) << what;
        EXPECT_EQ(what.find("exceeds"), std::string::npos) << what;  // no length read from text is quoted
        EXPECT_EQ(what.find("runs past"), std::string::npos) << what;
      }
    }
  }
  // Files too short to hold a length and a JSON object are not safetensors files either, whatever the eight
  // bytes they have would read as.
  for (const std::string& tiny : {std::string("12345678"), std::string("123456789"), std::string("abc")}) {
    SCOPED_TRACE(tiny);
    gdskit::test::write_file(dir / "tiny.bin", std::vector<std::uint8_t>(tiny.begin(), tiny.end()));
    try {
      st::read_header(dir / "tiny.bin");
      FAIL() << "parsed";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), EBADMSG);
      EXPECT_NE(std::string(e.what()).find("not a safetensors file"), std::string::npos) << e.what();
      // No length read from the bytes ("12345678" is 4050765991979987505 as one) is quoted or measured.
      EXPECT_EQ(std::string(e.what()).find("405076"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("exceeds"), std::string::npos) << e.what();
    }
  }
  // A safetensors file whose length field is damaged still says so: its JSON does begin with '{'.
  try {
    parse(make_file("{}", 0, true, 4096));
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_NE(std::string(e.what()).find("header length 4096"), std::string::npos) << e.what();
  }
}

// A file cut short is blamed on the tensor that reaches furthest, never on an empty tensor at the end.
TEST(SafetensorsHeader, TruncatedFileNamesTheTensorThatReachesFurthest) {
  // "a" is empty and sorts first by name; "b" holds the 40 bytes the data section lacks.
  const std::string json = R"({"a":{"dtype":"F16","shape":[0],"data_offsets":[40,40]},)"
                           R"("b":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}})";
  const auto cut = make_file(json, 32);
  try {
    parse(cut);
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EBADMSG);
    const std::string what = e.what();
    // What the header asks for against what the file has: 8 bytes missing.
    const std::string counts = "truncated: expected " + std::to_string(cut.size() + 8) + " bytes, the file has " +
                               std::to_string(cut.size());
    EXPECT_NE(what.find(counts), std::string::npos) << what;
    EXPECT_NE(what.find("tensor \"b\""), std::string::npos) << what;
    EXPECT_EQ(what.find("tensor \"a\""), std::string::npos) << what;
  }
  EXPECT_EQ(parse(make_file(json, 40)).tensors.size(), 2u);
  // An empty tensor that alone points past the end is the one at fault.
  try {
    parse(make_file(R"({"a":{"dtype":"F16","shape":[0],"data_offsets":[50,50]},)"
                    R"("b":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}})", 40));
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor \"a\""), std::string::npos) << e.what();
  }
}

TEST(SafetensorsHeader, GapsBetweenTensorsAreAllowed) {
  auto h = parse(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                               "b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})", 16));
  EXPECT_EQ(h.tensors.size(), 2u);
}

TEST(SafetensorsHeader, ReadHeaderFromFile) {
  gdskit::test::temp_dir dir;
  auto f = make_file(R"({"a":{"dtype":"U16","shape":[3],"data_offsets":[0,6]}})", 6);
  gdskit::test::write_file(dir / "m.safetensors", f);
  auto h = st::read_header(dir / "m.safetensors");
  EXPECT_EQ(h.file_nbytes, f.size());
  EXPECT_EQ(h.find("a")->shape, std::vector<std::uint64_t>{3});
  // Truncated on disk: the data section is shorter than the offsets claim.
  f.resize(f.size() - 1);
  gdskit::test::write_file(dir / "short.safetensors", f);
  try {
    st::read_header(dir / "short.safetensors");
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code().value(), EBADMSG);
    EXPECT_NE(std::string(e.what()).find("short.safetensors"), std::string::npos);
  }
}

TEST(SafetensorsHeader, LargestSignedDimensionIsAccepted) {
  auto h = parse(make_file(R"({"a":{"dtype":"U8","shape":[0,9223372036854775807],"data_offsets":[0,0]}})", 0));
  EXPECT_EQ(h.tensors.at(0).shape.at(1), 9223372036854775807u);
}

// n one-element F32 tensors, optionally with the first name repeated at the end.
std::vector<std::uint8_t> many_tensors(std::size_t n, bool duplicate_last = false) {
  std::string json = "{";
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t name = duplicate_last && i + 1 == n ? 0 : i;
    json += "\"layer." + std::to_string(name) + ".weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
            std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}" + (i + 1 < n ? "," : "");
  }
  json += "}";
  return make_file(json, 4 * n);
}

// Best of three parses, in seconds.
double parse_seconds(const std::vector<std::uint8_t>& f) {
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = parse(f);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_FALSE(h.tensors.empty());
  }
  return best;
}

TEST(SafetensorsHeader, ParseTimeGrowsLinearlyWithTensorCount) {
  // 8x the tensors: a linear parser takes about 8x (n log n and cache misses a little more); a quadratic one 64x.
  // A burst of load from other processes can stretch one measurement (17x was seen once on a busy 2-core
  // machine), so up to three rounds are measured: quadratic work fails every one of them.
  const auto small = many_tensors(5000), large = many_tensors(40000);
  double t_small = 0, t_large = 0;
  for (int round = 0; round < 3; ++round) {
    t_small = std::max(parse_seconds(small), 1e-4);
    t_large = parse_seconds(large);
    if (t_large <= 16 * t_small) break;
  }
  EXPECT_LE(t_large, 16 * t_small) << "5k tensors: " << t_small << " s, 40k tensors: " << t_large << " s";
  EXPECT_EQ(parse(large).tensors.size(), 40000u);
  // Duplicate detection stays on for large headers.
  EXPECT_EQ(parse_errno(many_tensors(40000, true)), EBADMSG);
}

TEST(SafetensorsHeader, PrintableNameEscapesWhatATerminalWouldObey) {
  EXPECT_EQ(st::printable_name("layers.0.weight"), "layers.0.weight");
  EXPECT_EQ(st::printable_name("a\nb"), "a\\nb");
  EXPECT_EQ(st::printable_name("\x1b[2J\t\r\\"), "\\x1b[2J\\t\\r\\\\");
  EXPECT_EQ(st::printable_name(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(st::printable_name("\x7f"), "\\x7f");
  EXPECT_EQ(st::printable_name("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // UTF-8 kept
  EXPECT_EQ(st::printable_name("\xff\xc3"), "\\xff\\xc3");                        // not UTF-8
  EXPECT_EQ(st::printable_name("\xc2\x9b" "31m"), "\\u009b31m");                   // C1 CSI
  EXPECT_EQ(st::printable_name("ab\xe2\x80\xae" "cd"), "ab\\u202ecd");             // right-to-left override
}

TEST(SafetensorsHeader, MessagesEscapeNamesFromTheFile) {
  // "\u001b" in JSON is a legal string that decodes to ESC: the error must not carry it raw.
  try {
    parse(make_file(R"({"x\u001b[31m\n":{"dtype":"F12","shape":[1],"data_offsets":[0,1]}})", 1));
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(std::string(e.what()).find('\x1b'), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x\\x1b[31m\\n"), std::string::npos) << e.what();
  }
  // A syntax error quotes the text it read last: a C1 CSI (valid UTF-8) or a right-to-left override in it is
  // escaped too.
  for (const char* text : {"{\"a\":\"\xc2\x9b" "31m", "{\"a\": x\xe2\x80\xae" "}"}) {
    try {
      parse(make_file(text, 0));
      ADD_FAILURE() << "parsed";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code().value(), EBADMSG);
      EXPECT_EQ(std::string(e.what()).find("\xc2\x9b"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("\xe2\x80\xae"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
