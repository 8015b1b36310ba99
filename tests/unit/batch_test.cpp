// Batches: many ranges across files, each equal to a pread reference on random data (unaligned offsets, odd
// sizes, short files), writes read back equal; bad input refused before any I/O; deadlines, cancel, the event
// descriptor, and one range's failure leaving the others alone.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "gdskit/batch.hpp"
#include "gdskit/checksum.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using namespace std::chrono_literals;
using test::random_bytes;
using test::temp_dir;

struct variant {
  engine_kind engine;
  direct_mode direct;
};

std::string name_of(const ::testing::TestParamInfo<variant>& i) {
  return std::string(to_string(i.param.engine)) + "_direct_" + std::string(to_string(i.param.direct));
}

class batch_variants : public ::testing::TestWithParam<variant> {
 protected:
  void SetUp() override {
    if (GetParam().engine == engine_kind::io_uring && !io_uring_unavailable_reason().empty()) {
      GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
    }
    if (GetParam().direct == direct_mode::on && test::direct_capable_parent().empty()) {
      GTEST_SKIP() << "no folder here accepts O_DIRECT";
    }
    dir_ = std::make_unique<temp_dir>(GetParam().direct == direct_mode::on ? test::direct_capable_parent()
                                                                            : std::filesystem::path{});
    config_.engine = GetParam().engine;
    config_.direct = GetParam().direct;
  }
  std::unique_ptr<temp_dir> dir_;
  settings config_;
};

TEST_P(batch_variants, random_ranges_across_files_equal_pread) {
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<file_handle> files;
  for (int k = 0; k < 3; ++k) {
    data.push_back(random_bytes(1'000'003 + k * 77'777, 100 + k));
    test::write_file(*dir_ / ("f" + std::to_string(k)), data.back());
    files.emplace_back(*dir_ / ("f" + std::to_string(k)), open_mode::read, open_options{}, config_);
  }
  constexpr std::size_t n = 3000;
  std::vector<std::vector<std::uint8_t>> out(n);
  std::vector<io_range> ranges;
  std::vector<std::size_t> which(n);
  for (std::size_t i = 0; i < n; ++i) {
    which[i] = rng() % files.size();
    const std::size_t size = data[which[i]].size();
    // Mostly small, some large, some running past the end of the file, some of size 0.
    std::size_t len = (i % 50 == 0) ? rng() % 300'000 : (i % 97 == 0 ? 0 : 1 + rng() % 9000);
    const std::uint64_t off = rng() % (size + 100);
    out[i].assign(len + 1, 0xEE);  // one guard byte past the range
    ranges.push_back({&files[which[i]], off, buffer_view::host(out[i].data(), len)});
  }
  const batch_result r = read_batch(ranges);
  ASSERT_EQ(r.ranges.size(), n);
  EXPECT_TRUE(r.ok());
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& d = data[which[i]];
    const std::uint64_t off = ranges[i].offset_bytes;
    const std::size_t len = ranges[i].memory.nbytes;
    const std::size_t expect = off >= d.size() ? 0 : std::min<std::size_t>(len, d.size() - off);
    ASSERT_FALSE(r.ranges[i].error) << "item " << i << ": " << r.ranges[i].error.message();
    ASSERT_EQ(r.ranges[i].nbytes, expect) << "item " << i;
    ASSERT_EQ(0, std::memcmp(out[i].data(), d.data() + std::min<std::uint64_t>(off, d.size()), expect)) << "item " << i;
    ASSERT_EQ(out[i][len], 0xEE) << "item " << i << " wrote past its memory";
    total += expect;
  }
  EXPECT_EQ(r.nbytes, total);
}

TEST_P(batch_variants, exact_reads_fail_short_ranges_only) {
  const auto d = random_bytes(50'000, 3);
  test::write_file(*dir_ / "short", d);
  file_handle f(*dir_ / "short", open_mode::read, {}, config_);
  std::vector<std::uint8_t> a(4096), b(8192), c(100);
  const io_range ranges[] = {{&f, 100, buffer_view::host(a.data(), a.size())},
                             {&f, 45'000, buffer_view::host(b.data(), b.size())},  // ends past the file
                             {&f, 49'900, buffer_view::host(c.data(), c.size())}};
  batch_options o;
  o.exact = true;
  const batch_result r = read_batch(ranges, o);
  EXPECT_TRUE(r.ranges[0].ok());
  EXPECT_EQ(r.ranges[1].error, errno_code(ENODATA));
  EXPECT_EQ(r.ranges[1].nbytes, 5000u);
  EXPECT_TRUE(r.ranges[2].ok());
  EXPECT_EQ(r.failed, 1u);
  EXPECT_EQ(0, std::memcmp(a.data(), d.data() + 100, a.size()));
  EXPECT_EQ(0, std::memcmp(c.data(), d.data() + 49'900, c.size()));
}

TEST_P(batch_variants, writes_read_back_equal) {
  file_handle f(*dir_ / "w", open_mode::read_write, {.create = true}, config_);
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::uint8_t>> src;
  std::vector<io_range> ranges;
  std::uint64_t pos = 0;
  std::vector<std::uint8_t> expect;
  for (int i = 0; i < 500; ++i) {
    const std::size_t len = (i % 40 == 0) ? 200'000 + rng() % 100'000 : 1 + rng() % 10'000;
    const std::size_t gap = rng() % 3 == 0 ? 0 : rng() % 5000;
    pos += gap;
    src.push_back(random_bytes(len, 1000 + i));
    ranges.push_back({&f, pos, buffer_view::host(src.back().data(), len)});
    if (expect.size() < pos + len) expect.resize(pos + len, 0);
    std::memcpy(expect.data() + pos, src.back().data(), len);
    pos += len;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  const batch_result r = write_batch(ranges);
  ASSERT_TRUE(r.ok());
  f.close();
  EXPECT_EQ(test::read_file(*dir_ / "w"), expect);
}

TEST_P(batch_variants, checksummed_reads_deliver_only_matching_bytes) {
  const auto d = random_bytes(3 << 20, 41);
  test::write_file(*dir_ / "c", d);
  file_handle f(*dir_ / "c", open_mode::read, {}, config_);
  std::mt19937_64 rng(2);
  constexpr std::size_t n = 300;
  std::vector<std::vector<std::uint8_t>> out(n);
  std::vector<io_range> ranges;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t len = i % 60 == 0 ? 5'000'000 / 4 + rng() % 1000 : 1 + rng() % 20'000;
    const std::uint64_t off = i % 61 == 0 ? d.size() - len / 2 : rng() % (d.size() - len);  // some run past the end
    out[i].assign(len, 0xEE);
    std::uint32_t expect = crc32c(d.data() + std::min<std::uint64_t>(off, d.size()),
                                  static_cast<std::size_t>(std::min<std::uint64_t>(len, d.size() - std::min<std::uint64_t>(off, d.size()))));
    if (i % 7 == 3) expect ^= 1;  // a corrupt block
    ranges.push_back({&f, off, buffer_view::host(out[i].data(), len), expect});
  }
  batch_options o;
  o.checksum = batch_checksum::crc32c;
  const batch_result r = read_batch(ranges, o);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t off = ranges[i].offset_bytes;
    const std::size_t len = out[i].size();
    if (off + len > d.size()) {
      EXPECT_EQ(r.ranges[i].error, errno_code(ENODATA)) << i;
    } else if (i % 7 == 3) {
      EXPECT_EQ(r.ranges[i].error, errno_code(EBADMSG)) << i;
      ++bad;
    } else {
      ASSERT_TRUE(r.ranges[i].ok()) << i << ": " << r.ranges[i].error.message();
      EXPECT_EQ(r.ranges[i].crc32c, ranges[i].crc32c);
      ASSERT_EQ(0, std::memcmp(out[i].data(), d.data() + off, len)) << i;
      continue;
    }
    EXPECT_EQ(out[i], std::vector<std::uint8_t>(len, 0xEE)) << "item " << i << " failed but its memory was written";
  }
  EXPECT_EQ(r.checksum_mismatches, bad);
}

TEST_P(batch_variants, checksummed_writes_report_the_checksum_of_what_they_wrote) {
  file_handle f(*dir_ / "cw", open_mode::read_write, {.create = true}, config_);
  std::vector<std::vector<std::uint8_t>> src;
  std::vector<io_range> ranges;
  std::uint64_t pos = 0;
  for (int i = 0; i < 50; ++i) {
    const std::size_t len = i % 10 == 0 ? (std::size_t{5} << 20) + 4096 * (i % 3) : 4096 * (1 + i % 5) + (i % 2) * 17;
    src.push_back(random_bytes(len, 500 + i));
    ranges.push_back({&f, pos, buffer_view::host(src.back().data(), len)});
    pos += len + (i % 3) * 4096;
  }
  batch_options o;
  o.checksum = batch_checksum::crc32c;
  const batch_result r = write_batch(ranges, o);
  ASSERT_TRUE(r.ok());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(r.ranges[i].crc32c, crc32c(src[i].data(), src[i].size())) << i;
    std::vector<std::uint8_t> back(src[i].size());
    ASSERT_EQ(f.pread(back.data(), back.size(), ranges[i].offset_bytes), back.size());
    ASSERT_EQ(back, src[i]) << i;
  }
}

// A read longer than one request that runs past the end of the file: split into requests, it moved only the
// bytes the file has (and, exact, fails with ENODATA), whatever the engine.
TEST_P(batch_variants, a_split_read_past_the_end_counts_only_the_bytes_that_exist) {
  const auto d = random_bytes((5 << 20) + 123, 16);
  test::write_file(*dir_ / "f", d);
  file_handle f(*dir_ / "f", open_mode::read, {}, config_);
  std::vector<std::uint8_t> mem((6 << 20) + 1, 0xEE);
  const io_range one{&f, 1000, buffer_view::host(mem.data() + 1, 6 << 20)};  // unaligned: through staging
  const std::size_t exist = d.size() - 1000;
  const batch_result r = read_batch(std::span(&one, 1));
  ASSERT_TRUE(r.ranges[0].ok()) << r.ranges[0].error.message();
  EXPECT_EQ(r.ranges[0].nbytes, exist);
  EXPECT_EQ(r.nbytes, exist);
  EXPECT_EQ(0, std::memcmp(mem.data() + 1, d.data() + 1000, exist));
  EXPECT_EQ(mem[1 + exist], 0xEE);
  batch_options o;
  o.exact = true;
  const batch_result e = read_batch(std::span(&one, 1), o);
  EXPECT_EQ(e.ranges[0].error, errno_code(ENODATA));
  EXPECT_EQ(e.ranges[0].nbytes, exist);
}

INSTANTIATE_TEST_SUITE_P(engines, batch_variants,
                         ::testing::Values(variant{engine_kind::io_uring, direct_mode::automatic},
                                           variant{engine_kind::io_uring, direct_mode::on},
                                           variant{engine_kind::threads, direct_mode::automatic},
                                           variant{engine_kind::threads, direct_mode::off}),
                         name_of);

class batch_test : public ::testing::Test {
 protected:
  temp_dir dir_;
};

TEST(crc32c, known_values_and_continuation) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(digits, 0), 0u);
  const std::vector<std::uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  std::vector<std::uint8_t> ones(32, 0xFF), up(32), down(32);   // ... of ones, increasing, decreasing
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<std::uint8_t>(i);
    down[i] = static_cast<std::uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
  const auto d = random_bytes(100'003, 9);
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{99'999}}) {
    EXPECT_EQ(crc32c(d.data() + cut, d.size() - cut, crc32c(d.data(), cut)), crc32c(d.data(), d.size())) << cut;
  }
}

// Long inputs are summed in three interleaved lanes that are joined afterwards: every length around the lanes'
// boundaries, from odd starting addresses and continuing from a previous sum, equals a bit-at-a-time sum.
TEST(crc32c, long_inputs_equal_the_bitwise_definition) {
  const auto bitwise = [](const std::uint8_t* p, std::size_t n, std::uint32_t crc) {
    std::uint32_t c = ~crc;
    for (std::size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) != 0 ? 0x82F63B78u : 0u);
    }
    return ~c;
  };
  const auto d = random_bytes(200'000, 17);
  std::vector<std::size_t> lengths;
  for (std::size_t lanes : {1, 2, 3, 4, 6, 7}) {
    for (std::size_t delta : {0, 1, 7, 8, 9}) {
      lengths.push_back(lanes * 8192 + delta);
      lengths.push_back(lanes * 8192 - delta - 1);
    }
  }
  lengths.push_back(d.size() - 3);
  for (std::size_t n : lengths) {
    for (std::size_t start : {0, 1, 3}) {
      EXPECT_EQ(crc32c(d.data() + start, n), bitwise(d.data() + start, n, 0)) << n << " from " << start;
      EXPECT_EQ(crc32c(d.data() + start, n, 0x1234567u), bitwise(d.data() + start, n, 0x1234567u)) << n;
    }
  }
}

// Reads of a file in the page cache go through it; reads of a cold file go straight to O_DIRECT (the batch asks
// the cache about a sample of its ranges, not about every request).
TEST_F(batch_test, cached_files_are_read_through_the_cache_and_cold_files_directly) {
  const auto d = random_bytes(8 << 20, 18);
  test::write_file(dir_ / "f", d);
  settings s;
  s.engine = engine_kind::threads;
  file_handle f(dir_ / "f", open_mode::read, {}, s);
  if (!f.choice().direct) GTEST_SKIP() << "no O_DIRECT here: " << f.choice().direct_reason;
  std::atomic<int> direct{0}, buffered{0};
  posix::syscall_table t = posix::real_syscalls();
  const auto real_pread = t.pread;
  t.pread = [&, real_pread](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
    ((::fcntl(fd, F_GETFL) & O_DIRECT) != 0 ? direct : buffered).fetch_add(1);
    return real_pread(fd, b, n, off);
  };
  std::mt19937_64 rng(3);
  std::vector<std::vector<std::uint8_t>> out(64, std::vector<std::uint8_t>(4096));
  std::vector<io_range> ranges;
  for (auto& o : out) ranges.push_back({&f, (rng() % ((8 << 20) / 4096 - 1)) * 4096 + 4096, buffer_view::host(o.data(), o.size())});
  batch_options o;
  o.coalesce_gap_bytes = 0;
  batch_routes routes;  // the batch's own account of it, checked against the calls
  auto read_all = [&] {
    direct = 0;
    buffered = 0;
    posix::scoped_syscalls guard(t);
    const batch_result r = read_batch(ranges, o);
    routes = r.routes;
    ASSERT_TRUE(r.ok());
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(out[i].data(), d.data() + ranges[i].offset_bytes, 4096)) << i;
    }
  };
  read_all();  // just written: every page is cached
  EXPECT_GT(buffered.load(), 0);
  EXPECT_EQ(direct.load(), 0);
  EXPECT_EQ(routes.buffered, routes.requests);
  f.drop_cache();
  {
    // What is left in the cache (mincore over a mapping of the file).
    const int fd = ::open((dir_ / "f").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    void* m = ::mmap(nullptr, d.size(), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(m, MAP_FAILED);
    std::vector<unsigned char> pages((d.size() + 4095) / 4096);
    ASSERT_EQ(::mincore(m, d.size(), pages.data()), 0);
    ::munmap(m, d.size());
    std::size_t cached = 0;
    for (unsigned char p : pages) cached += p & 1u;
    if (cached > 0) GTEST_SKIP() << "the file system kept " << cached << " pages after DONTNEED";
  }
  read_all();
  EXPECT_EQ(buffered.load(), 0);
  EXPECT_GT(direct.load(), 0);
  EXPECT_EQ(routes.buffered, 0u);
  EXPECT_GT(routes.requests, 0u);
}

TEST_F(batch_test, checksummed_ranges_are_at_most_16_mib) {
  file_handle f(dir_ / "big", open_mode::read_write, {.create = true});
  std::vector<std::uint8_t> mem(17 << 20);
  const io_range one{&f, 0, buffer_view::host(mem.data(), mem.size())};
  batch_options o;
  o.checksum = batch_checksum::crc32c;
  try {
    (void)read_batch(std::span(&one, 1), o);
    ADD_FAILURE() << "accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errno_code(EINVAL));
  }
}

TEST_F(batch_test, bad_input_is_refused_before_any_io) {
  const auto d = random_bytes(100'000, 5);
  test::write_file(dir_ / "f", d);
  file_handle f(dir_ / "f", open_mode::read);
  file_handle closed;
  std::vector<std::uint8_t> mem(10'000);
  std::atomic<int> calls{0};
  posix::scoped_syscalls guard(test::counting_syscalls(calls));
  auto refused = [&](std::vector<io_range> ranges, io_direction dir, int code, const char* item = "item 1") {
    try {
      (void)transfer(dir, ranges);
      ADD_FAILURE() << "accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errno_code(code)) << e.what();
      EXPECT_NE(std::string(e.what()).find(item), std::string::npos) << e.what();
    }
  };
  const io_range good{&f, 0, buffer_view::host(mem.data(), 100)};
  refused({good, {nullptr, 0, buffer_view::host(mem.data() + 200, 10)}}, io_direction::read, EINVAL);
  refused({good, {&closed, 0, buffer_view::host(mem.data() + 200, 10)}}, io_direction::read, EBADF);
  refused({good, {&f, 0, buffer_view::host(mem.data() + 50, 100)}}, io_direction::read, EINVAL);  // overlap
  refused({good, {&f, std::uint64_t{1} << 63, buffer_view::host(mem.data() + 200, 10)}}, io_direction::read, EINVAL,
          "item 1 at offset 9223372036854775808");  // never printed as a negative number
  refused({good, {&f, 0, buffer_view::host(nullptr, 10)}}, io_direction::read, EFAULT);
  refused({good, {&f, 0, buffer_view::host(mem.data() + 200, 10)}}, io_direction::write, EBADF,
          "item 0");  // read-only file
  buffer_view gpu{mem.data() + 500, 10, memory_kind::device, 0};
  if (!gpu_available()) refused({good, {&f, 0, gpu}}, io_direction::read, ENODEV);
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(batch_test, overlapping_writes_in_one_file_are_refused) {
  file_handle f(dir_ / "w", open_mode::write, {.create = true});
  std::vector<std::uint8_t> a(100), b(100);
  const io_range ranges[] = {{&f, 1000, buffer_view::host(a.data(), 100)}, {&f, 1050, buffer_view::host(b.data(), 100)}};
  try {
    (void)write_batch(ranges);
    ADD_FAILURE() << "accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errno_code(EINVAL));
  }
  EXPECT_EQ(f.size(), 0u);
}

TEST_F(batch_test, empty_batch_and_zero_sizes_complete_at_once) {
  const batch_result r = read_batch({});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.ranges.empty());
  test::write_file(dir_ / "f", random_bytes(10, 1));
  file_handle f(dir_ / "f", open_mode::read);
  std::uint8_t x = 0;
  const io_range one{&f, 5, buffer_view::host(&x, 0)};
  const batch_result z = read_batch(std::span(&one, 1));
  EXPECT_TRUE(z.ok());
  EXPECT_EQ(z.ranges[0].nbytes, 0u);
}

TEST_F(batch_test, past_deadline_times_out_every_range_without_io) {
  test::write_file(dir_ / "f", random_bytes(100'000, 2));
  file_handle f(dir_ / "f", open_mode::read);
  std::vector<std::uint8_t> mem(1000);
  std::vector<io_range> ranges;
  for (int i = 0; i < 10; ++i) ranges.push_back({&f, std::uint64_t(i) * 100, buffer_view::host(mem.data() + i * 100, 100)});
  std::atomic<int> calls{0};
  posix::scoped_syscalls guard(test::counting_syscalls(calls));
  batch_options o;
  o.deadline = std::chrono::steady_clock::now();
  const batch_result r = read_batch(ranges, o);
  EXPECT_EQ(r.failed, 10u);
  for (const auto& x : r.ranges) EXPECT_EQ(x.error, errno_code(ETIMEDOUT));
  EXPECT_EQ(calls.load(), 0);
}

// A device that stops answering: reads block until the test lets them go. The deadline completes the batch
// on time; memory is released only once the blocked requests have ended.
TEST_F(batch_test, deadline_completes_a_hung_batch_and_release_waits_for_the_kernel) {
  test::write_file(dir_ / "f", random_bytes(1 << 20, 4));
  settings s;
  s.engine = engine_kind::threads;
  file_handle f(dir_ / "f", open_mode::read, {}, s);
  std::atomic<bool> let_go{false};
  std::atomic<int> blocked{0};
  posix::syscall_table t = posix::real_syscalls();
  const auto real_pread = t.pread;
  t.pread = [&](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
    ++blocked;
    while (!let_go.load()) std::this_thread::sleep_for(1ms);
    return real_pread(fd, b, n, off);
  };
  t.uring_result = [&](bool, int, std::uint64_t, std::size_t, int res) {
    while (!let_go.load()) std::this_thread::sleep_for(1ms);
    return res;
  };
  posix::scoped_syscalls guard(t);
  std::vector<std::uint8_t> mem(64 * 4096);
  std::vector<io_range> ranges;
  for (int i = 0; i < 64; ++i) ranges.push_back({&f, std::uint64_t(i) * 8192, buffer_view::host(mem.data() + i * 4096, 4096)});
  batch_options o;
  o.deadline = std::chrono::steady_clock::now() + 100ms;
  const auto t0 = std::chrono::steady_clock::now();
  batch_future fut = submit_reads(ranges, o);
  ASSERT_TRUE(fut.wait_for(5s)) << "the deadline did not complete the batch";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  const batch_result& r = fut.get();
  EXPECT_EQ(r.failed, 64u);
  for (const auto& x : r.ranges) EXPECT_EQ(x.error, errno_code(ETIMEDOUT));
  EXPECT_FALSE(fut.released()) << "requests still held by the 'kernel' target the memory";
  let_go = true;
  fut.wait_released();
  EXPECT_TRUE(fut.released());
}

TEST_F(batch_test, wait_for_the_longest_timeout_waits_until_ready) {
  test::write_file(dir_ / "f", random_bytes(100'000, 17));
  settings s;
  s.engine = engine_kind::threads;
  file_handle f(dir_ / "f", open_mode::read, {}, s);
  posix::scoped_syscalls guard(test::slow_preads([](off_t) -> std::chrono::nanoseconds { return 50ms; }));
  std::vector<std::uint8_t> mem(1000);
  const io_range one{&f, 7, buffer_view::host(mem.data(), mem.size())};
  batch_future fut = submit_reads(std::span(&one, 1));
  EXPECT_TRUE(fut.wait_for(std::chrono::nanoseconds::max())) << "returned before the batch was ready";
  EXPECT_TRUE(fut.ready());
}

TEST_F(batch_test, event_fd_becomes_readable_and_cancel_after_completion_changes_nothing) {
  const auto d = random_bytes(300'000, 9);
  test::write_file(dir_ / "f", d);
  file_handle f(dir_ / "f", open_mode::read);
  std::vector<std::uint8_t> mem(d.size());
  std::vector<io_range> ranges;
  for (std::size_t off = 0; off < d.size(); off += 3000) {
    ranges.push_back({&f, off, buffer_view::host(mem.data() + off, std::min<std::size_t>(3000, d.size() - off))});
  }
  batch_future fut = submit_reads(ranges);
  pollfd p{fut.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10'000), 1);
  EXPECT_TRUE(fut.ready());
  EXPECT_FALSE(fut.cancel());
  EXPECT_TRUE(fut.get().ok());
  EXPECT_EQ(mem, d);
  EXPECT_EQ(::poll(&p, 1, 0), 1) << "stays readable";
}

TEST_F(batch_test, one_failing_range_leaves_the_others) {
  const auto d = random_bytes(200'000, 12);
  file_handle f = test::open_for_seam(dir_ / "f", d);
  posix::syscall_table t = posix::real_syscalls();
  const auto real_pread = t.pread;
  t.pread = [&](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
    if (off <= 50'000 && 50'000 < off + static_cast<off_t>(n)) {
      errno = EIO;
      return -1;
    }
    return real_pread(fd, b, n, off);
  };
  posix::scoped_syscalls guard(t);
  std::vector<std::uint8_t> mem(d.size());
  std::vector<io_range> ranges;
  for (std::size_t off = 0; off < d.size(); off += 10'000) {
    ranges.push_back({&f, off, buffer_view::host(mem.data() + off, 10'000)});
  }
  const batch_result r = read_batch(ranges);
  EXPECT_EQ(r.failed, 1u);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].offset_bytes == 50'000) {
      EXPECT_EQ(r.ranges[i].error, errno_code(EIO));
    } else {
      ASSERT_TRUE(r.ranges[i].ok()) << i;
      EXPECT_EQ(0, std::memcmp(mem.data() + ranges[i].offset_bytes, d.data() + ranges[i].offset_bytes, 10'000));
    }
  }
}

// A file cut short while its batch runs (by another process, acted out here at the batch's first read): the
// ranges past the new end fail with ENODATA and say how much they got, the ranges before it are read whole and
// right, and nothing is reported as read that was not.
TEST_F(batch_test, a_file_truncated_while_its_batch_runs) {
  const auto d = random_bytes(1 << 20, 21);
  file_handle f = test::open_for_seam(dir_ / "f", d);
  constexpr std::uint64_t cut = 295'000;  // not page aligned, and inside range 18
  std::atomic<bool> truncated{false};
  std::once_flag once;
  posix::syscall_table t = posix::real_syscalls();
  const auto real_pread = t.pread;
  const std::string path = (dir_ / "f").string();
  t.pread = [&, real_pread](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
    // Every read waits until the file is cut (the engine's workers read side by side).
    std::call_once(once, [&] { truncated = ::truncate(path.c_str(), static_cast<off_t>(cut)) == 0; });
    return real_pread(fd, b, n, off);
  };
  std::vector<std::vector<std::uint8_t>> out(64, std::vector<std::uint8_t>(10'000, 0xEE));
  std::vector<io_range> ranges;
  for (std::size_t i = 0; i < out.size(); ++i) {
    ranges.push_back({&f, i * 16'000 + 7, buffer_view::host(out[i].data(), out[i].size())});
  }
  batch_options o;
  o.coalesce_gap_bytes = 0;
  o.exact = true;
  batch_result r;
  {
    posix::scoped_syscalls guard(t);
    r = read_batch(ranges, o);
  }
  ASSERT_TRUE(truncated.load());
  std::size_t ok = 0, cut_short = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint64_t begin = ranges[i].offset_bytes, end = begin + out[i].size();
    if (end <= cut) {
      ASSERT_TRUE(r.ranges[i].ok()) << i << ": " << r.ranges[i].error.message();
      EXPECT_EQ(0, std::memcmp(out[i].data(), d.data() + begin, out[i].size())) << i;
      ++ok;
    } else {
      EXPECT_EQ(r.ranges[i].error, errno_code(ENODATA)) << i;
      const std::uint64_t have = begin < cut ? cut - begin : 0;
      EXPECT_EQ(r.ranges[i].nbytes, have) << i;
      EXPECT_EQ(0, std::memcmp(out[i].data(), d.data() + begin, have)) << i;
      ++cut_short;
    }
  }
  EXPECT_GT(ok, 10u);
  EXPECT_GT(cut_short, 10u);
  EXPECT_EQ(r.failed, cut_short);
}

TEST_F(batch_test, close_waits_for_a_running_batch) {
  const auto d = random_bytes(2 << 20, 13);
  test::write_file(dir_ / "f", d);
  file_handle f(dir_ / "f", open_mode::read);
  std::vector<std::uint8_t> mem(d.size());
  std::vector<io_range> ranges;
  for (std::size_t off = 0; off < d.size(); off += 4096) ranges.push_back({&f, off, buffer_view::host(mem.data() + off, 4096)});
  batch_future fut = submit_reads(ranges);
  f.close();
  EXPECT_TRUE(fut.released());
  EXPECT_TRUE(fut.get().ok());
  EXPECT_EQ(mem, d);
}

// Reads through the seam at `from` and beyond wait while `hold` is set (20 s at most): a slow device that the
// test lets go once it has looked, however slowly the machine runs the rest.
posix::syscall_table reads_held_from(off_t from, const std::atomic<bool>& hold) {
  posix::syscall_table t = posix::real_syscalls();
  t.pread = [real = t.pread, from, &hold](int fd, void* b, std::size_t n, off_t off) -> ssize_t {
    for (int i = 0; off >= from && i < 20000 && hold; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return real(fd, b, n, off);
  };
  return t;
}

}  // namespace
// wait_pending_at_most returns once no more than that many ranges are left, before the batch is ready: a caller
// can queue its next batch while this one's slowest range still runs.
TEST_F(batch_test, waiting_for_all_but_the_last_range) {
  const auto data = random_bytes(4 << 20, 91);
  file_handle f = test::open_for_seam(dir_ / "f", data);
  std::atomic<bool> hold{true};
  posix::scoped_syscalls guard(reads_held_from(3 << 20, hold));  // the last range
  std::vector<std::uint8_t> mem(4 << 20);
  std::vector<io_range> ranges;
  for (std::size_t i = 0; i < 4; ++i) {  // 1 MiB apart with gaps: never joined into one request
    ranges.push_back({&f, i * (1 << 20), buffer_view::host(mem.data() + i * (1 << 20), (1 << 20) - 65536)});
  }
  batch_options o;
  o.coalesce_gap_bytes = 0;
  batch_future fut = submit_reads(ranges, o);
  EXPECT_LE(fut.wait_pending_at_most(1), 1u);
  EXPECT_FALSE(fut.ready()) << "returned only when the slow range was done";
  hold = false;
  EXPECT_EQ(fut.wait_pending_at_most(0), 0u);
  EXPECT_TRUE(fut.ready());
  ASSERT_TRUE(fut.get().ok());
  EXPECT_EQ(std::memcmp(mem.data() + (3 << 20), data.data() + (3 << 20), (1 << 20) - 65536), 0);
}

}  // namespace gdskit

namespace gdskit {

// on_ready chains work on a batch's completion without a thread that waits: callbacks added before the batch is
// ready run once its bytes have landed, in the order added, off the caller's thread; one that throws does not stop
// the next; one may submit the next batch; one added to a ready batch runs at once; a deadline runs them too.
TEST_F(batch_test, on_ready_runs_callbacks_once_the_bytes_landed) {
  const auto data = random_bytes(1 << 20, 57);
  file_handle f = test::open_for_seam(dir_ / "f", data);
  std::atomic<bool> hold{true};
  posix::scoped_syscalls guard(reads_held_from(512 << 10, hold));

  // Added to a ready batch: runs at once, here.
  batch_future empty = submit_reads({});
  bool ran = false;
  empty.on_ready([&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_THROW(empty.on_ready({}), error);

  std::vector<std::uint8_t> first(4096, 0xEE), second(4096, 0xEE);
  std::mutex m;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::promise<void> chained_done;
  std::unique_ptr<batch_future> chained;
  batch_future fut = submit_reads(std::vector<io_range>{{&f, 600 << 10, buffer_view::host(first.data(), first.size())}});
  fut.on_ready([&] {
    std::lock_guard lock(m);
    order.push_back(1);
    threads.push_back(std::this_thread::get_id());
    EXPECT_EQ(0, std::memcmp(first.data(), data.data() + (600 << 10), first.size())) << "ran before the bytes landed";
  });
  fut.on_ready([] { throw std::runtime_error("a failing callback"); });
  fut.on_ready([&] {
    {
      std::lock_guard lock(m);
      order.push_back(3);
    }
    // The next batch, submitted from the callback; its own callback ends the test's wait.
    chained = std::make_unique<batch_future>(
        submit_reads(std::vector<io_range>{{&f, 4096, buffer_view::host(second.data(), second.size())}}));
    chained->on_ready([&] { chained_done.set_value(); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard lock(m);
    EXPECT_TRUE(order.empty()) << "a callback ran before the batch was ready";
  }
  hold = false;
  ASSERT_EQ(chained_done.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  {
    std::lock_guard lock(m);
    EXPECT_EQ(order, (std::vector<int>{1, 3}));
    ASSERT_EQ(threads.size(), 1u);
    EXPECT_NE(threads[0], std::this_thread::get_id());
  }
  EXPECT_TRUE(fut.get().ok());
  ASSERT_TRUE(chained->get().ok());
  EXPECT_EQ(0, std::memcmp(second.data(), data.data() + 4096, second.size()));

  // A deadline completes the batch and runs its callbacks; the held read then ends by itself.
  hold = true;
  std::vector<std::uint8_t> late(4096, 0xEE);
  batch_options o;
  o.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  batch_future timed = submit_reads(std::vector<io_range>{{&f, 700 << 10, buffer_view::host(late.data(), late.size())}}, o);
  std::promise<std::error_code> seen;
  timed.on_ready([&] { seen.set_value(timed.get().ranges[0].error); });
  auto s = seen.get_future();
  ASSERT_EQ(s.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(s.get(), std::errc::timed_out);
  hold = false;
  timed.wait_released();
}

}  // namespace gdskit
