// Host I/O engine: every read equals a plain pread reference, every write reads back equal, on random data,
// for both engines and every O_DIRECT setting, with unaligned offsets, sizes and buffers.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <tuple>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using test::random_bytes;
using test::temp_dir;

struct variant {
  engine_kind engine;
  direct_mode direct;
};

std::string name_of(const variant& v) {
  return std::string(to_string(v.engine)) + "_direct_" + std::string(to_string(v.direct));
}

settings small_chunks(const variant& v) {
  settings s;
  s.threads = 4;
  s.chunk_bytes = 64 * 1024;  // small chunks so modest files fan out over many tasks
  s.inline_bytes = 16 * 1024;
  s.engine = v.engine;
  s.direct = v.direct;
  return s;
}

class engine_variants : public ::testing::TestWithParam<variant> {
 protected:
  void SetUp() override {
    if (GetParam().engine == engine_kind::io_uring && !io_uring_unavailable_reason().empty()) {
      GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
    }
    parent_ = GetParam().direct == direct_mode::on ? test::direct_capable_parent() : std::filesystem::path{};
    if (GetParam().direct == direct_mode::on && parent_.empty()) GTEST_SKIP() << "no folder here accepts O_DIRECT";
    dir_ = std::make_unique<temp_dir>(parent_);
  }
  std::filesystem::path parent_;
  std::unique_ptr<temp_dir> dir_;
};

// A buffer whose data pointer has a chosen misalignment relative to 4 KiB.
struct offset_buffer {
  offset_buffer(std::size_t n, std::size_t misalign) : storage(n + 8192), data(storage.data() + misalign) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    data = storage.data() + ((4096 - addr % 4096) % 4096) + misalign;
  }
  std::vector<std::uint8_t> storage;
  std::uint8_t* data;
};

TEST_P(engine_variants, reads_equal_pread_reference) {
  const std::vector<std::size_t> sizes = {0, 1, 4095, 4096, 4097, 65535, 65536, 65537, (1u << 20) + 3,
                                          (8u << 20) - 1, (64u << 20) + 1};
  std::mt19937_64 rng(1234);
  for (std::size_t size : sizes) {
    auto data = random_bytes(size, size * 31 + 7);
    auto path = *dir_ / ("f" + std::to_string(size));
    test::write_file(path, data);
    file_handle f(path, open_mode::read, {}, small_chunks(GetParam()));
    if (GetParam().direct == direct_mode::on) {
      ASSERT_TRUE(f.choice().direct) << f.choice().direct_reason;
    }
    const int rounds = size > (8u << 20) ? 6 : 24;
    for (int r = 0; r < rounds; ++r) {
      std::uint64_t off = size == 0 ? 0 : rng() % (size + 10);
      if (r % 4 == 0) off = off / 4096 * 4096;  // aligned offsets too
      std::size_t len = static_cast<std::size_t>(rng() % (std::min<std::size_t>(size, 3u << 20) + 8200));
      if (r % 5 == 0) len = len / 4096 * 4096;
      if (r == 0) {  // whole file, from zero
        off = 0;
        len = size;
      }
      const std::size_t misalign = (r % 3 == 0) ? 0 : static_cast<std::size_t>(rng() % 4096);
      offset_buffer buf(len, misalign);
      std::size_t got = f.pread(buf.data, len, off);
      const std::size_t expect = off >= size ? 0 : std::min<std::size_t>(len, size - off);
      ASSERT_EQ(got, expect) << "size " << size << " off " << off << " len " << len;
      if (got == 0) continue;  // nothing to compare (and memcmp must not see an empty vector's null data)
      ASSERT_EQ(0, std::memcmp(buf.data, data.data() + std::min<std::uint64_t>(off, size), got))
          << "size " << size << " off " << off << " len " << len << " misalign " << misalign;
    }
  }
}

TEST_P(engine_variants, writes_read_back_equal) {
  std::mt19937_64 rng(99);
  auto path = *dir_ / "w";
  const std::size_t size = (4u << 20) + 4097;
  std::vector<std::uint8_t> mirror;
  {
    file_handle f(path, open_mode::read_write, {.create = true, .truncate = true}, small_chunks(GetParam()));
    for (int r = 0; r < 40; ++r) {
      std::uint64_t off = rng() % size;
      if (r % 4 == 0) off = off / 4096 * 4096;
      std::size_t len = static_cast<std::size_t>(rng() % (1u << 20)) + 1;
      if (r % 5 == 0) len = (len + 4095) / 4096 * 4096;
      auto src = random_bytes(len, static_cast<std::uint64_t>(r) + 1000);
      offset_buffer buf(len, r % 2 == 0 ? 0 : static_cast<std::size_t>(rng() % 4096));
      std::memcpy(buf.data, src.data(), len);
      ASSERT_EQ(f.pwrite(buf.data, len, off), len);
      if (mirror.size() < off + len) mirror.resize(off + len, 0);
      std::memcpy(mirror.data() + off, src.data(), len);
      if (r % 10 == 9) {  // reads through the same handle see the writes
        std::vector<std::uint8_t> back(mirror.size());
        ASSERT_EQ(f.pread(back.data(), back.size(), 0), mirror.size());
        ASSERT_EQ(back, mirror);
      }
    }
    ASSERT_EQ(f.size(), mirror.size());
  }
  EXPECT_EQ(test::read_file(path), mirror);
}

TEST_P(engine_variants, async_forms_match_blocking) {
  auto data = random_bytes((2u << 20) + 123, 5);
  auto path = *dir_ / "a";
  test::write_file(path, data);
  file_handle f(path, open_mode::read_write, {}, small_chunks(GetParam()));
  std::vector<std::uint8_t> a(data.size()), b(1000);
  auto fa = f.pread_async(a.data(), a.size(), 0);
  auto fb = f.pread_async(b.data(), b.size(), 4097);
  EXPECT_EQ(fa.get(), data.size());
  EXPECT_EQ(fb.get(), b.size());
  EXPECT_EQ(a, data);
  EXPECT_EQ(0, std::memcmp(b.data(), data.data() + 4097, b.size()));
  auto patch = random_bytes(70000, 6);
  EXPECT_EQ(f.pwrite_async(patch.data(), patch.size(), 12345).get(), patch.size());
  std::memcpy(data.data() + 12345, patch.data(), patch.size());
  EXPECT_EQ(test::read_file(path), data);
}

// read_async / write_async take buffer views (host here; GPU views in tests/gpu/paths_test.cpp) with the
// blocking forms' contracts, and their futures outlive the handle.
TEST_P(engine_variants, buffer_view_async_forms_match_blocking) {
  auto data = random_bytes((1u << 20) + 4099, 15);
  auto path = *dir_ / "v";
  test::write_file(path, data);
  std::vector<std::uint8_t> a(data.size() + 100, 0), b(5000, 0);
  auto patch = random_bytes(300001, 16);
  io_future fa, fb, fw;
  {
    file_handle f(path, open_mode::read_write, {}, small_chunks(GetParam()));
    fa = f.read_async(buffer_view::host(a.data(), a.size()), a.size(), 0);
    fb = f.read_async(buffer_view::host(b.data(), b.size()), b.size(), 4093);
    try {
      (void)f.read_async(buffer_view::host(b.data(), 10), 20, 0);  // view smaller than the request
      FAIL() << "a view smaller than the request must be refused";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::invalid_argument);
    }
  }
  EXPECT_EQ(fa.get(), data.size()) << "a read returns fewer bytes only at end of file";
  EXPECT_EQ(0, std::memcmp(a.data(), data.data(), data.size()));
  EXPECT_EQ(fb.get(), b.size());
  EXPECT_EQ(0, std::memcmp(b.data(), data.data() + 4093, b.size()));
  {
    file_handle f(path, open_mode::read_write, {}, small_chunks(GetParam()));
    fw = f.write_async(buffer_view::host(patch.data(), patch.size()), patch.size(), data.size() + 7);
  }
  EXPECT_EQ(fw.get(), patch.size());
  auto disk = test::read_file(path);
  ASSERT_EQ(disk.size(), data.size() + 7 + patch.size());
  EXPECT_EQ(0, std::memcmp(disk.data() + data.size() + 7, patch.data(), patch.size()));
}

// Offsets are off_t: a range past 2^63 - 1 must be refused before any I/O. Unchecked, offset + nbytes wraps
// around and an O_DIRECT write lands at the start of the file (or a buffered one is reported done unwritten).
TEST_P(engine_variants, ranges_past_the_largest_offset_are_refused_before_any_io) {
  auto data = random_bytes(65536, 99);
  auto path = *dir_ / "limits";
  test::write_file(path, data);
  std::atomic<int> io_calls{0};
  posix::scoped_syscalls guard(test::counting_syscalls(io_calls));
  file_handle f(path, open_mode::read_write, {}, small_chunks(GetParam()));
  constexpr std::uint64_t max = 9223372036854775807ull;  // 2^63 - 1
  std::vector<std::uint8_t> buf(1u << 20, 0x5A);
  auto code_of = [](auto&& call) {
    try {
      call();
    } catch (const error& e) {
      return e.code();
    }
    return std::error_code();
  };
  const auto einval = std::make_error_code(std::errc::invalid_argument);
  const auto efbig = std::make_error_code(std::errc::file_too_large);
  for (std::size_t n : {std::size_t{4096}, std::size_t{1} << 20}) {
    for (std::uint64_t off : {~std::uint64_t{0}, ~std::uint64_t{0} - 4095, max + 1}) {
      EXPECT_EQ(code_of([&] { f.pwrite(buf.data(), n, off); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.pread(buf.data(), n, off); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.read_exact(buf.data(), n, off); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.write(buffer_view::host(buf.data(), n), n, off); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.read(buffer_view::host(buf.data(), n), n, off); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.pwrite_async(buf.data(), n, off).get(); }), einval) << off;
      EXPECT_EQ(code_of([&] { f.pread_async(buf.data(), n, off).get(); }), einval) << off;
    }
    // A range that starts inside the limit but ends past it: too big a file for a write, invalid for a read.
    EXPECT_EQ(code_of([&] { f.pwrite(buf.data(), n, max - 100); }), efbig);
    EXPECT_EQ(code_of([&] { f.write(buffer_view::host(buf.data(), n), n, max - 100); }), efbig);
    EXPECT_EQ(code_of([&] { f.pread(buf.data(), n, max - 100); }), einval);
  }
  EXPECT_EQ(code_of([&] { f.truncate(max + 1); }), einval);
  EXPECT_EQ(code_of([&] { f.truncate(~std::uint64_t{0}); }), einval);
  EXPECT_EQ(code_of([&] { f.reserve(max + 1); }), einval);
  EXPECT_EQ(io_calls.load(), 0) << "a refused range reached the file";
  EXPECT_EQ(test::read_file(path), data);
  // The last byte of the range is still usable for a read (nothing is there).
  EXPECT_EQ(f.pread(buf.data(), 1, max - 1), 0u);
  // Closed here, inside the seam: a pool worker that still holds the file from an async call would otherwise
  // close it after the seam is gone, while this thread restores the syscall table.
  f.close();
}

INSTANTIATE_TEST_SUITE_P(all, engine_variants,
                         ::testing::Values(variant{engine_kind::threads, direct_mode::automatic},
                                           variant{engine_kind::threads, direct_mode::on},
                                           variant{engine_kind::threads, direct_mode::off},
                                           variant{engine_kind::io_uring, direct_mode::automatic},
                                           variant{engine_kind::io_uring, direct_mode::on},
                                           variant{engine_kind::io_uring, direct_mode::off}),
                         [](const auto& info) { return name_of(info.param); });

TEST(file_handle, tmpfs_refuses_direct_but_works) {
  auto shm = test::direct_refusing_parent();
  if (shm.empty()) GTEST_SKIP() << "no file system here refuses O_DIRECT (/dev/shm missing)";
  temp_dir dir(shm);
  auto data = random_bytes(300000, 8);
  test::write_file(dir / "x", data);
  settings s;
  s.chunk_bytes = 65536;
  file_handle f(dir / "x", open_mode::read, {}, s);
  EXPECT_FALSE(f.choice().direct);
  EXPECT_NE(f.choice().direct_reason.find("refuses O_DIRECT"), std::string::npos) << f.choice().direct_reason;
  std::vector<std::uint8_t> back(data.size());
  EXPECT_EQ(f.pread(back.data(), back.size(), 0), data.size());
  EXPECT_EQ(back, data);
  s.direct = direct_mode::on;
  try {
    file_handle g(dir / "x", open_mode::read, {}, s);
    FAIL() << "GDSKIT_DIRECT=on must refuse a file system without O_DIRECT";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
}

// Kernels from 6.6 accept O_DIRECT on tmpfs, so the refusal is also simulated through the seam (EINVAL from
// open with O_DIRECT is what file systems without direct I/O return).
TEST(file_handle, simulated_direct_refusal_falls_back_to_buffered) {
  temp_dir dir;
  auto data = random_bytes(1000003, 12);
  test::write_file(dir / "r", data);
  posix::syscall_table t = posix::real_syscalls();
  t.open = [](const char* p, int flags, mode_t m) {
    if ((flags & O_DIRECT) != 0) {
      errno = EINVAL;
      return -1;
    }
    return posix::real_syscalls().open(p, flags, m);
  };
  posix::scoped_syscalls guard(t);
  for (engine_kind e : {engine_kind::threads, engine_kind::automatic}) {
    settings s;
    s.chunk_bytes = 65536;
    s.engine = e;
    file_handle f(dir / "r", open_mode::read_write, {}, s);
    EXPECT_FALSE(f.choice().direct);
    EXPECT_NE(f.choice().direct_reason.find("refuses O_DIRECT"), std::string::npos) << f.choice().direct_reason;
    std::vector<std::uint8_t> back(data.size());
    EXPECT_EQ(f.pread(back.data(), back.size(), 0), data.size());
    EXPECT_EQ(back, data);
    auto patch = random_bytes(5000, 13);
    EXPECT_EQ(f.pwrite(patch.data(), patch.size(), 4093), patch.size());
    std::memcpy(data.data() + 4093, patch.data(), patch.size());
  }
  EXPECT_EQ(test::read_file(dir / "r"), data);
  settings on;
  on.direct = direct_mode::on;
  try {
    file_handle f(dir / "r", open_mode::read, {}, on);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
}

TEST(file_handle, open_errors_name_the_path) {
  temp_dir dir;
  try {
    file_handle f(dir / "missing", open_mode::read);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
  try {
    file_handle f(dir.path(), open_mode::read);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::is_a_directory);
  }
  test::write_file(dir / "exists", {1, 2, 3});
  EXPECT_THROW(file_handle(dir / "exists", open_mode::write, {.create = true, .exclusive = true}), error);
  // Nothing is created or truncated unless asked for.
  EXPECT_THROW(file_handle(dir / "new", open_mode::write), error);
  EXPECT_FALSE(std::filesystem::exists(dir / "new"));
  { file_handle f(dir / "exists", open_mode::write); }
  EXPECT_EQ(std::filesystem::file_size(dir / "exists"), 3u);
}

// A FIFO, a socket or a character device is refused at once, naming what it is: a FIFO opened without its
// other end would otherwise block the open forever (checked with a watchdog that opens the other end, so that a
// regression fails here instead of hanging the suite).
TEST(file_handle, fifos_sockets_and_character_devices_are_refused_without_blocking) {
  temp_dir dir;
  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto refused = [](const std::filesystem::path& p, open_mode mode, const char* kind) {
    auto attempt = std::async(std::launch::async, [&] {
      try {
        file_handle f(p, mode);
        return std::string("opened");
      } catch (const error& e) {
        return std::string(e.what()) + (e.code() == std::errc::invalid_argument ? "" : " (not EINVAL)");
      }
    });
    if (attempt.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      const int other_end = ::open(p.c_str(), O_RDWR | O_NONBLOCK);  // lets the blocked open return
      const std::string what = attempt.get();
      if (other_end >= 0) ::close(other_end);
      ADD_FAILURE() << p << ": the open blocked (" << what << ")";
      return;
    }
    const std::string what = attempt.get();
    EXPECT_NE(what.find(kind), std::string::npos) << what;
    EXPECT_NE(what.find(p.filename().string()), std::string::npos) << what;
    EXPECT_EQ(what.find("not EINVAL"), std::string::npos) << what;
  };
  refused(fifo, open_mode::read, "a FIFO");
  refused(fifo, open_mode::write, "a FIFO");  // no reader: ENXIO from the kernel, said as what it is
  refused(fifo, open_mode::read_write, "a FIFO");
  refused("/dev/null", open_mode::read, "a character device");
  refused("/dev/zero", open_mode::read_write, "a character device");
  EXPECT_EQ(std::filesystem::status(fifo).type(), std::filesystem::file_type::fifo);  // left as it was

  const auto sock_path = dir / "sock";
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock_path.string().size(), sizeof addr.sun_path);
  std::strcpy(addr.sun_path, sock_path.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  refused(sock_path, open_mode::read, "a socket");  // the kernel answers ENXIO: said as what it is
  refused(sock_path, open_mode::write, "a socket");
  ::close(sock);

  // A regular file opened the same way works as before: blocking reads and writes, no O_NONBLOCK left on
  // either descriptor (io_uring would answer EAGAIN on one that keeps it).
  test::write_file(dir / "plain", random_bytes(10000, 5));
  file_handle f(dir / "plain", open_mode::read_write);
  EXPECT_EQ(::fcntl(f.fd(), F_GETFL) & O_NONBLOCK, 0);
  if (f.direct_fd() >= 0) EXPECT_EQ(::fcntl(f.direct_fd(), F_GETFL) & O_NONBLOCK, 0);
  std::vector<std::uint8_t> back(10000);
  EXPECT_EQ(f.pread(back.data(), back.size(), 0), back.size());
  EXPECT_EQ(back, random_bytes(10000, 5));
  EXPECT_EQ(f.pwrite(back.data(), 100, 20000), 100u);
}

// A file under a lease someone else holds (a Samba oplock, an NFS delegation; here a read lease of this
// process's own, which an open for writing breaks) is opened once the holder lets go, as a blocking open
// waits: the non-blocking open the FIFO check needs must not turn the lease into an error.
TEST(file_handle, an_open_waits_for_a_lease_to_be_given_up) {
  temp_dir dir;
  test::write_file(dir / "leased", random_bytes(4096, 8));
  const int holder = ::open((dir / "leased").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(holder, 0);
  struct sigaction quiet {};
  quiet.sa_handler = SIG_IGN;
  struct sigaction before {};
  ::sigaction(SIGIO, &quiet, &before);  // the kernel tells the holder by SIGIO: ignored here
  if (::fcntl(holder, F_SETLEASE, F_RDLCK) != 0) {
    const int e = errno;
    ::close(holder);
    ::sigaction(SIGIO, &before, nullptr);
    GTEST_SKIP() << "no leases here: " << std::strerror(e);
  }
  std::thread let_go([holder] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::fcntl(holder, F_SETLEASE, F_UNLCK);
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string outcome = "opened";
  try {
    file_handle f(dir / "leased", open_mode::read_write);
  } catch (const error& e) {
    outcome = e.what();
  }
  let_go.join();
  ::close(holder);
  ::sigaction(SIGIO, &before, nullptr);
  EXPECT_EQ(outcome, "opened");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250)) << "the lease was not in the way";
}

TEST(file_handle, read_exact_throws_with_counts) {
  temp_dir dir;
  auto data = random_bytes(10000, 3);
  test::write_file(dir / "s", data);
  file_handle f(dir / "s", open_mode::read);
  std::vector<std::uint8_t> buf(20000);
  EXPECT_EQ(f.pread(buf.data(), buf.size(), 0), 10000u);
  EXPECT_EQ(f.pread(buf.data(), buf.size(), 10000), 0u);
  EXPECT_EQ(f.pread(buf.data(), buf.size(), 99999), 0u);
  try {
    f.read_exact(buf.data(), 5000, 8000);
    FAIL();
  } catch (const short_read_error& e) {
    EXPECT_EQ(e.code(), std::errc::io_error);
    EXPECT_EQ(e.transferred(), 2000u);
    EXPECT_EQ(e.offset_bytes(), 8000);
    EXPECT_EQ(e.nbytes(), 5000u);
  }
  EXPECT_THROW(f.pwrite(buf.data(), 10, 0), error);  // read-only handle
}

TEST(file_handle, engine_choice_is_recorded) {
  temp_dir dir;
  test::write_file(dir / "e", {1});
  settings s;
  s.engine = engine_kind::threads;
  file_handle t(dir / "e", open_mode::read, {}, s);
  EXPECT_EQ(t.choice().engine, engine_kind::threads);
  EXPECT_EQ(t.choice().engine_reason, "GDSKIT_ENGINE=threads");
  s.engine = engine_kind::automatic;
  file_handle a(dir / "e", open_mode::read, {}, s);
  if (io_uring_unavailable_reason().empty()) {
    EXPECT_EQ(a.choice().engine, engine_kind::io_uring);
  } else {
    EXPECT_EQ(a.choice().engine, engine_kind::threads);
    EXPECT_NE(a.choice().engine_reason.find(io_uring_unavailable_reason()), std::string::npos);
  }
}

// The plan says where the O_DIRECT schedule of each direction the handle was opened for comes from.
TEST(file_handle, plan_names_the_schedule_of_each_direction_opened) {
  temp_dir dir(test::direct_capable_parent());
  test::write_file(dir / "s", std::vector<std::uint8_t>(8192, 1));
  std::uint8_t b[8] = {};
  auto has = [](const path_decision& d, std::string_view what) {
    for (const auto& r : d.reasons) {
      if (r.find(what) != std::string::npos) return true;
    }
    return false;
  };
  settings s;
  s.direct = direct_mode::on;
  const std::pair<open_mode, std::pair<bool, bool>> modes[] = {
      {open_mode::read, {true, false}}, {open_mode::write, {false, true}}, {open_mode::read_write, {true, true}}};
  for (const auto& [mode, want] : modes) {
    file_handle f(dir / "s", mode, {}, s);
    const path_decision d = f.plan(buffer_view::host(b, 8));
    EXPECT_EQ(has(d, "O_DIRECT host reads"), want.first) << d.summary();
    EXPECT_EQ(has(d, "O_DIRECT host writes"), want.second) << d.summary();
    EXPECT_EQ(has(d, "gathered host writes (through aligned slots)"), want.second) << d.summary();
  }
}

// write_gather checks every extent before it writes a byte, then writes them all.
TEST(file_handle, write_gather_checks_every_extent_first_then_writes_them_all) {
  temp_dir dir(test::direct_capable_parent());
  auto before = std::vector<std::uint8_t>(300000, 7);
  test::write_file(dir / "w", before);
  file_handle f(dir / "w", open_mode::read_write);
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::uint8_t>> src;
  for (int i = 0; i < 5; ++i) src.push_back(random_bytes(10000 + static_cast<std::size_t>(rng() % 50000), rng()));
  std::vector<write_extent> ok;
  std::uint64_t pos = 4097;
  for (auto& s : src) {
    ok.push_back({buffer_view::host(s.data(), s.size()), pos});
    pos += s.size() + 333;
  }
  auto refused = [&](std::vector<write_extent> e) {
    try {
      f.write_gather(e);
    } catch (const error& x) {
      return x.code() == std::errc::invalid_argument;
    }
    return false;
  };
  auto overlap = ok;
  overlap[3].offset_bytes = overlap[2].offset_bytes + 1;
  EXPECT_TRUE(refused(overlap));
  auto mixed = ok;
  int fake = 0;
  mixed[1].src = {&fake, sizeof fake, memory_kind::device, 0};
  EXPECT_TRUE(refused(mixed));
  auto past = ok;
  past[4].offset_bytes = (std::uint64_t{1} << 63) - 10;
  try {
    f.write_gather(past);
    ADD_FAILURE();
  } catch (const error&) {
  }
  EXPECT_EQ(test::read_file(dir / "w"), before);  // nothing written by a refused call

  std::atomic<std::size_t> reported{0};  // progress and cancelled are called from the transfer's threads
  std::reverse(ok.begin(), ok.end());  // any order
  std::size_t total = 0;
  for (auto& e : ok) total += e.src.nbytes;
  EXPECT_EQ(f.write_gather(ok, {.progress = [&](std::size_t n) { reported += n; }}), total);
  EXPECT_EQ(reported, total);
  auto want = before;
  for (auto& e : ok) {
    if (want.size() < e.offset_bytes + e.src.nbytes) want.resize(e.offset_bytes + e.src.nbytes, 0);
    std::memcpy(want.data() + e.offset_bytes, e.src.data, e.src.nbytes);
  }
  EXPECT_EQ(test::read_file(dir / "w"), want);
  std::atomic<int> calls{0};
  try {
    f.write_gather(ok, {.cancelled = [&] { return ++calls > 2; }});
    ADD_FAILURE();
  } catch (const error& x) {
    EXPECT_EQ(x.code(), std::errc::operation_canceled);
  }
}

// Host memory through O_DIRECT: tensors at odd addresses and odd file offsets, back to back with one gap, go out
// as two ranges cut into aligned requests; only the partial blocks at the ends of each range are written through
// the page cache, the bytes in the gap stay as they were, and a failing request fails the call with its error.
TEST(file_handle, host_write_gather_cuts_joined_extents_into_aligned_requests) {
  const auto parent = test::direct_capable_parent();
  if (parent.empty()) GTEST_SKIP() << "no folder here accepts O_DIRECT";
  temp_dir dir(parent);
  settings s;
  s.direct = direct_mode::on;
  s.staging_slot_bytes = 256 * 1024;
  s.staging_slot_bytes_set = true;  // pieces of at most 256 KiB: many requests per range
  s.threads = 4;
  std::vector<std::vector<std::uint8_t>> src;
  std::vector<write_extent> extents;
  std::uint64_t pos = 8 + 4321;
  const std::uint64_t gap_at = 25;
  for (int i = 0; i < 50; ++i) {
    const std::size_t n = 1 + (static_cast<std::size_t>(i) * 7919u) % 90000;
    src.push_back(random_bytes(n + 1, 300 + i));
    extents.push_back({buffer_view::host(src.back().data() + 1, n), pos});  // memory off every alignment
    pos += n + (i == gap_at ? 5000 : 0);
  }
  const auto before = random_bytes(pos + 6000, 77);
  test::write_file(dir / "g", before);
  file_handle f(dir / "g", open_mode::read_write, {}, s);
  const std::size_t a = f.choice().alignment;
  auto unaligned = std::make_shared<std::atomic<int>>(0);
  auto direct_writes = std::make_shared<std::atomic<int>>(0);
  posix::syscall_table t = posix::real_syscalls();
  t.pwrite = [unaligned, direct_writes, a](int fd, const void* b, std::size_t n, off_t off) -> ssize_t {
    if (off % static_cast<off_t>(a) != 0 || n % a != 0) {
      ++*unaligned;
    } else {
      ++*direct_writes;
    }
    return posix::real_syscalls().pwrite(fd, b, n, off);
  };
  std::size_t total = 0;
  for (const auto& e : extents) total += e.src.nbytes;
  {
    posix::scoped_syscalls guard(t);
    ASSERT_EQ(f.write_gather(extents), total);
  }
  EXPECT_LE(unaligned->load(), 4) << "joins between extents went through the page cache";
  EXPECT_GT(direct_writes->load(), 8);
  auto want = before;
  for (const auto& e : extents) std::memcpy(want.data() + e.offset_bytes, e.src.data, e.src.nbytes);
  EXPECT_EQ(test::read_file(dir / "g"), want);

  // The fifth aligned request fails: the call throws EIO naming the file, whatever the other lanes did.
  auto seen = std::make_shared<std::atomic<int>>(0);
  t.pwrite = [seen, a](int fd, const void* b, std::size_t n, off_t off) -> ssize_t {
    if (off % static_cast<off_t>(a) == 0 && n % a == 0 && ++*seen == 5) {
      errno = EIO;
      return -1;
    }
    return posix::real_syscalls().pwrite(fd, b, n, off);
  };
  std::error_code ec;
  try {
    posix::scoped_syscalls guard(t);
    f.write_gather(extents);
  } catch (const error& e) {
    ec = e.code();
    EXPECT_NE(std::string(e.what()).find("/g\" at "), std::string::npos) << e.what();
  }
  EXPECT_EQ(ec, std::errc::io_error);
}

// An empty handle (default-constructed or moved-from) answers its accessors with empty values and refuses
// I/O with EBADF; it must never dereference the missing inside.
TEST(file_handle, empty_handles_have_defined_behaviour) {
  temp_dir dir;
  test::write_file(dir / "m", {1, 2, 3});
  file_handle opened(dir / "m", open_mode::read_write);
  file_handle moved_to(std::move(opened));
  EXPECT_TRUE(moved_to.is_open());
  file_handle fresh;
  for (const file_handle* h : {&fresh, &opened}) {
    const file_handle& f = *h;
    EXPECT_FALSE(f.is_open());
    EXPECT_TRUE(f.path().empty());
    EXPECT_EQ(f.mode(), open_mode::read);
    EXPECT_FALSE(f.choice().direct);
    EXPECT_EQ(f.config().threads, settings{}.threads);
    EXPECT_EQ(f.fd(), -1);
    EXPECT_EQ(f.direct_fd(), -1);
    std::uint8_t b[8] = {};
    EXPECT_EQ(f.plan(buffer_view::host(b, 8)).path, data_path::host);
    auto ebadf = [](auto&& call) {
      try {
        call();
      } catch (const error& e) {
        return e.code() == std::errc::bad_file_descriptor;
      }
      return false;
    };
    EXPECT_TRUE(ebadf([&] { f.pread(b, 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.pwrite(b, 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.read_exact(b, 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.read(buffer_view::host(b, 8), 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.read_exact(buffer_view::host(b, 8), 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.write(buffer_view::host(b, 8), 8, 0); }));
    EXPECT_TRUE(ebadf([&] { f.pread_async(b, 8, 0).get(); }));
    EXPECT_TRUE(ebadf([&] { f.pwrite_async(b, 8, 0).get(); }));
    EXPECT_TRUE(ebadf([&] { f.read_async(buffer_view::host(b, 8), 8, 0).get(); }));
    EXPECT_TRUE(ebadf([&] { f.write_async(buffer_view::host(b, 8), 8, 0).get(); }));
    EXPECT_TRUE(ebadf([&] { f.size(); }));
    EXPECT_TRUE(ebadf([&] { f.truncate(0); }));
    EXPECT_TRUE(ebadf([&] { f.reserve(8); }));
    EXPECT_TRUE(ebadf([&] { f.sync(); }));
    EXPECT_TRUE(ebadf([&] { f.drop_cache(); }));
  }
  file_handle assigned;
  assigned = std::move(moved_to);
  EXPECT_FALSE(moved_to.is_open());
  EXPECT_TRUE(moved_to.path().empty());
  EXPECT_EQ(assigned.size(), 3u);
}

// A future may outlive its handle: the operation still runs on an open file, and the descriptor closes only
// when the last operation has finished.
TEST(file_handle, futures_keep_the_file_open) {
  temp_dir dir;
  auto data = random_bytes(100000, 21);
  test::write_file(dir / "a", data);
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::atomic<int> closes{0};
  const std::filesystem::path file = std::filesystem::canonical(dir / "a");
  posix::syscall_table t = posix::real_syscalls();
  t.pread = [started](int fd, void* b, std::size_t n, off_t o) {
    started.wait();  // hold every read until the handle is gone
    return posix::real_syscalls().pread(fd, b, n, o);
  };
  // Only closes of the test file count: other threads of the process (a learned profile written, a /proc
  // file read) close their own descriptors through the same seam.
  t.close = [&closes, file](int fd) {
    std::error_code ec;
    if (std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec) == file) ++closes;
    return posix::real_syscalls().close(fd);
  };
  posix::scoped_syscalls guard(t);
  settings s;
  s.direct = direct_mode::off;
  std::vector<std::uint8_t> back(data.size());
  io_future fut;
  io_future wfut;
  auto patch = random_bytes(5000, 22);
  {
    file_handle f(dir / "a", open_mode::read_write, {}, s);
    fut = f.pread_async(back.data(), back.size(), 0);
    wfut = f.pwrite_async(patch.data(), patch.size(), 200000);
  }
  EXPECT_EQ(closes.load(), 0) << "the file was closed under an operation in flight";
  go.set_value();
  EXPECT_EQ(fut.get(), data.size());
  EXPECT_EQ(back, data);
  EXPECT_EQ(wfut.get(), patch.size());
  fut = io_future{};
  wfut = io_future{};
  for (int i = 0; i < 2000 && closes.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(closes.load(), 1) << "the file is closed once, when the last operation is done and released";
  auto on_disk = test::read_file(dir / "a");
  ASSERT_EQ(on_disk.size(), 205000u);
  EXPECT_EQ(0, std::memcmp(on_disk.data() + 200000, patch.data(), patch.size()));
}

// A block device's st_size is 0; its size is what the device says. Simulated through the seam: the file
// looks like a block device of fewer bytes than the file holds, and reads stop at the device's end.
TEST(file_handle, block_device_size_comes_from_the_device) {
  temp_dir dir;
  auto data = random_bytes(100000, 41);
  test::write_file(dir / "b", data);
  constexpr std::uint64_t device_bytes = 69632;
  std::atomic<int> asked{0};
  posix::syscall_table t = posix::real_syscalls();
  t.fstat = [](int fd, struct stat* st) {
    int r = posix::real_syscalls().fstat(fd, st);
    st->st_mode = (st->st_mode & ~S_IFMT) | S_IFBLK;
    st->st_size = 0;
    return r;
  };
  t.block_device_size = [&](int, std::uint64_t* n) {
    ++asked;
    *n = device_bytes;
    return 0;
  };
  posix::scoped_syscalls guard(t);
  file_handle f(dir / "b", open_mode::read);
  EXPECT_EQ(f.size(), device_bytes);
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(f.pread(back.data(), back.size(), 0), device_bytes);
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), device_bytes));
  EXPECT_EQ(f.pread(back.data(), 10, device_bytes), 0u);
  EXPECT_GE(asked.load(), 2);
}

// Runs a command and returns its first line of output ("" when it fails).
std::string first_line_of(const std::string& command) {
  std::FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {};
  char line[512] = {};
  const bool got = std::fgets(line, sizeof line, p) != nullptr;
  const int status = ::pclose(p);
  if (!got || status != 0) return {};
  std::string out(line);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// The same on a real loop device (needs root and loop devices; skipped with the reason otherwise).
TEST(file_handle, loop_device_reads_whole) {
  temp_dir dir;
  auto data = random_bytes((1u << 20) + 3 * 4096, 42);
  test::write_file(dir / "img", data);
  const std::string dev = first_line_of("losetup -f --show '" + (dir / "img").string() + "' 2>/dev/null");
  if (dev.rfind("/dev/loop", 0) != 0) GTEST_SKIP() << "no loop device could be attached (losetup -f --show needs root)";
  struct detach {
    std::string dev;
    ~detach() { first_line_of("losetup -d '" + dev + "' 2>/dev/null; echo"); }
  } guard{dev};
  for (direct_mode d : {direct_mode::automatic, direct_mode::off}) {
    settings s;
    s.direct = d;
    s.chunk_bytes = 65536;
    s.inline_bytes = 4096;
    file_handle f(dev, open_mode::read, {}, s);
    EXPECT_EQ(f.size(), data.size());
    std::vector<std::uint8_t> back(data.size() + 4096);
    ASSERT_EQ(f.pread(back.data(), back.size(), 0), data.size()) << dev;
    back.resize(data.size());
    EXPECT_EQ(back, data);
    std::vector<std::uint8_t> tail(5000);
    ASSERT_EQ(f.pread(tail.data(), tail.size(), data.size() - 1000), 1000u);
    EXPECT_EQ(0, std::memcmp(tail.data(), data.data() + data.size() - 1000, 1000));
  }
}

}  // namespace
}  // namespace gdskit

namespace gdskit {
namespace {

// reserve() makes the file at least that long, never shorter, and says whether space was reserved; where the file
// system cannot reserve (EOPNOTSUPP) it sizes the file anyway; other errors (ENOSPC) are errors.
TEST(file_handle_reserve, sizes_the_file_and_falls_back_where_space_cannot_be_reserved) {
  temp_dir dir;
  const auto path = dir / "r.bin";
  file_handle f(path, open_mode::read_write, {.create = true});
  f.reserve(1 << 20);  // true where the file system reserves space (the temporary folder's may not)
  EXPECT_EQ(f.size(), 1u << 20);
  std::vector<std::byte> zeros(1 << 20), got(1 << 20, std::byte{1});
  EXPECT_EQ(f.pread(got.data(), got.size(), 0), got.size());
  EXPECT_EQ(got, zeros);
  f.reserve(4096);
  EXPECT_EQ(f.size(), 1u << 20) << "reserve never shrinks a file";
  {
    // Interrupted (tmpfs stops at any pending signal): asked again.
    auto calls = std::make_shared<int>(0);
    posix::syscall_table t = posix::real_syscalls();
    t.fallocate = [calls](int fd, int mode, off_t o, off_t n) {
      if (++*calls <= 2) {
        errno = EINTR;
        return -1;
      }
      return posix::real_syscalls().fallocate(fd, mode, o, n);
    };
    posix::scoped_syscalls guard(t);
    f.reserve(2 << 20);
    EXPECT_EQ(f.size(), 2u << 20);
    EXPECT_EQ(*calls, 3);
  }
  for (int err : {EOPNOTSUPP, EINVAL, ENOSPC}) {
    posix::syscall_table t = posix::real_syscalls();
    t.fallocate = [err](int, int, off_t, off_t) {
      errno = err;
      return -1;
    };
    posix::scoped_syscalls guard(t);
    if (err != ENOSPC) {
      EXPECT_FALSE(f.reserve(3u << 20));
      EXPECT_EQ(f.size(), 3u << 20);
    } else {
      std::error_code ec;
      try {
        f.reserve(5 << 20);
      } catch (const error& e) {
        ec = e.code();
      }
      EXPECT_EQ(ec, std::error_code(ENOSPC, std::generic_category()));
      EXPECT_EQ(f.size(), 3u << 20);
    }
  }
}

}  // namespace
}  // namespace gdskit
