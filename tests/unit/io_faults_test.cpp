// Faults injected through the syscall seam: EINTR storms, short transfers, EIO at an offset, ENOSPC. The
// right error code comes out, the message names the failing range, and no partial success is reported.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/syscalls.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using posix::real_syscalls;
using posix::scoped_syscalls;
using posix::syscall_table;
using test::random_bytes;
using test::temp_dir;

settings faulty_settings(engine_kind e) {
  settings s;
  s.threads = 4;
  s.chunk_bytes = 64 * 1024;
  s.inline_bytes = 4096;
  s.engine = e;
  s.direct = direct_mode::off;  // buffered: the seam's pread/pwrite see every byte
  return s;
}

class faults : public ::testing::TestWithParam<engine_kind> {
 protected:
  void SetUp() override {
    if (GetParam() == engine_kind::io_uring && !io_uring_unavailable_reason().empty()) {
      GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
    }
    data_ = random_bytes(1u << 20, 77);
    test::write_file(dir_ / "f", data_);
  }
  bool uring() const { return GetParam() == engine_kind::io_uring; }
  temp_dir dir_;
  std::vector<std::uint8_t> data_;
};

TEST_P(faults, eintr_storm_is_retried) {
  syscall_table t = real_syscalls();
  std::atomic<int> calls{0};
  t.pread = [&](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
    if (calls++ % 2 == 0) {
      errno = EINTR;
      return -1;
    }
    return real_syscalls().pread(fd, b, n, o);
  };
  t.pwrite = [&](int fd, const void* b, std::size_t n, off_t o) -> ssize_t {
    if (calls++ % 2 == 0) {
      errno = EINTR;
      return -1;
    }
    return real_syscalls().pwrite(fd, b, n, o);
  };
  t.uring_result = [&](bool, int, std::uint64_t, std::size_t, int res) { return calls++ % 2 == 0 ? -EINTR : res; };
  scoped_syscalls guard(t);
  file_handle f(dir_ / "f", open_mode::read_write, {}, faulty_settings(GetParam()));
  std::vector<std::uint8_t> back(data_.size());
  EXPECT_EQ(f.pread(back.data(), back.size(), 0), data_.size());
  EXPECT_EQ(back, data_);
  auto patch = random_bytes(300000, 4);
  EXPECT_EQ(f.pwrite(patch.data(), patch.size(), 777), patch.size());
  std::memcpy(data_.data() + 777, patch.data(), patch.size());
  EXPECT_EQ(test::read_file(dir_ / "f"), data_);
  EXPECT_GT(calls.load(), 10);
}

TEST_P(faults, short_transfers_are_looped) {
  syscall_table t = real_syscalls();
  t.pread = [](int fd, void* b, std::size_t n, off_t o) { return real_syscalls().pread(fd, b, n > 1 ? n / 2 : n, o); };
  t.pwrite = [](int fd, const void* b, std::size_t n, off_t o) {
    return real_syscalls().pwrite(fd, b, n > 3 ? n / 3 : n, o);
  };
  // io_uring: the kernel moved everything, but the engine is told less and must ask again for the rest.
  t.uring_result = [](bool, int, std::uint64_t, std::size_t, int res) { return res > 1 ? res / 2 : res; };
  scoped_syscalls guard(t);
  file_handle f(dir_ / "f", open_mode::read_write, {}, faulty_settings(GetParam()));
  std::vector<std::uint8_t> back(data_.size());
  EXPECT_EQ(f.pread(back.data(), back.size(), 0), data_.size());
  EXPECT_EQ(back, data_);
  auto patch = random_bytes(500001, 9);
  EXPECT_EQ(f.pwrite(patch.data(), patch.size(), 4095), patch.size());
  std::memcpy(data_.data() + 4095, patch.data(), patch.size());
  EXPECT_EQ(test::read_file(dir_ / "f"), data_);
}

TEST_P(faults, eio_at_an_offset_fails_the_whole_read) {
  const std::uint64_t bad = 5 * 65536 + 100;  // inside the sixth chunk
  syscall_table t = real_syscalls();
  t.pread = [&](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
    if (static_cast<std::uint64_t>(o) <= bad && bad < static_cast<std::uint64_t>(o) + n) {
      errno = EIO;
      return -1;
    }
    return real_syscalls().pread(fd, b, n, o);
  };
  t.uring_result = [&](bool, int, std::uint64_t o, std::size_t n, int res) { return (o <= bad && bad < o + n) ? -EIO : res; };
  scoped_syscalls guard(t);
  file_handle f(dir_ / "f", open_mode::read, {}, faulty_settings(GetParam()));
  std::vector<std::uint8_t> back(data_.size());
  try {
    f.pread(back.data(), back.size(), 0);
    FAIL() << "a read with an I/O error must not succeed";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::io_error);
    EXPECT_EQ(e.operation(), "pread");
    EXPECT_LE(static_cast<std::uint64_t>(e.offset_bytes()), bad);
    EXPECT_GT(static_cast<std::uint64_t>(e.offset_bytes()) + e.nbytes(), bad);
    EXPECT_NE(std::string(e.what()).find((dir_ / "f").string()), std::string::npos);
  }
  // Reads that stay clear of the bad range still work.
  EXPECT_EQ(f.pread(back.data(), 65536, 0), 65536u);
}

TEST_P(faults, enospc_is_an_error_never_a_short_success) {
  syscall_table t = real_syscalls();
  const std::uint64_t limit = 200000;  // the "device" holds this many bytes
  t.pwrite = [&](int fd, const void* b, std::size_t n, off_t o) -> ssize_t {
    if (static_cast<std::uint64_t>(o) >= limit) {
      errno = ENOSPC;
      return -1;
    }
    std::size_t room = static_cast<std::size_t>(limit - static_cast<std::uint64_t>(o));
    return real_syscalls().pwrite(fd, b, std::min(n, room), o);
  };
  t.uring_result = [&](bool write, int, std::uint64_t o, std::size_t, int res) {
    return (write && o >= limit) ? -ENOSPC : res;
  };
  scoped_syscalls guard(t);
  file_handle f(dir_ / "g", open_mode::write, {.create = true}, faulty_settings(GetParam()));
  auto src = random_bytes(600000, 1);
  try {
    f.pwrite(src.data(), src.size(), 0);
    FAIL() << "a full device must not report a successful write";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::no_space_on_device);
    EXPECT_EQ(e.operation(), "pwrite");
  }
}

TEST_P(faults, write_returning_zero_is_enospc) {
  syscall_table t = real_syscalls();
  t.pwrite = [](int, const void*, std::size_t, off_t) -> ssize_t { return 0; };
  t.uring_result = [](bool write, int, std::uint64_t, std::size_t, int res) { return write ? 0 : res; };
  scoped_syscalls guard(t);
  file_handle f(dir_ / "h", open_mode::write, {.create = true}, faulty_settings(GetParam()));
  auto src = random_bytes(300000, 2);
  try {
    f.pwrite(src.data(), src.size(), 0);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::no_space_on_device);
  }
}

INSTANTIATE_TEST_SUITE_P(engines, faults, ::testing::Values(engine_kind::threads, engine_kind::io_uring),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Runs `body` on a thread of its own and fails (ending the process: a hung engine cannot be unwound) if it
// has not finished within `seconds`.
void within_deadline(int seconds, std::function<void()> body) {
  std::packaged_task<void()> task(std::move(body));
  auto done = task.get_future();
  std::thread(std::move(task)).detach();
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "the engine did not return within " << seconds << " s";
    std::_Exit(1);
  }
  done.get();
}

std::error_code code_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const error& e) {
    return e.code();
  }
  return {};
}

// The ring itself refusing a submission (io_uring_enter failing with ENOMEM, EFAULT, ...): tasks never
// submitted must fail the request, never look like end of file or a finished write.
class uring_submission : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!io_uring_unavailable_reason().empty()) GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
    data_ = random_bytes(1u << 20, 31);
    test::write_file(dir_ / "f", data_);
  }
  settings uring_settings() const {
    settings s = faulty_settings(engine_kind::io_uring);
    return s;
  }
  temp_dir dir_;
  std::vector<std::uint8_t> data_;
};

TEST_F(uring_submission, a_refused_submission_fails_the_request) {
  for (bool kernel_took_them : {false, true}) {
    std::atomic<int> failures_left{0};
    syscall_table t = real_syscalls();
    t.uring_submit_and_wait = [&](void* ring, unsigned wait_nr) {
      if (failures_left > 0) {
        --failures_left;
        // Either nothing was taken, or the kernel took the entries and then failed (waiting, say).
        if (kernel_took_them) real_syscalls().uring_submit_and_wait(ring, 0);
        return -ENOMEM;
      }
      return real_syscalls().uring_submit_and_wait(ring, wait_nr);
    };
    scoped_syscalls guard(t);
    within_deadline(60, [&] {
      file_handle f(dir_ / "f", open_mode::read_write, {}, uring_settings());
      auto src = random_bytes(data_.size(), 32);
      failures_left = 1;
      EXPECT_EQ(code_of([&] { f.pwrite(src.data(), src.size(), 0); }), std::errc::not_enough_memory)
          << "a write of which part was never submitted returned success";
      std::vector<std::uint8_t> back(data_.size());
      failures_left = 1;
      EXPECT_EQ(code_of([&] { f.pread(back.data(), back.size(), 0); }), std::errc::not_enough_memory)
          << "a read of which part was never submitted looked like end of file";
      // The same thread's next requests run on a fresh ring: nothing left over from the failed ones lands.
      auto again = random_bytes(data_.size(), 33);
      EXPECT_EQ(f.pwrite(again.data(), again.size(), 0), again.size());
      EXPECT_EQ(f.pread(back.data(), back.size(), 0), back.size());
      EXPECT_EQ(back, again);
      EXPECT_EQ(test::read_file(dir_ / "f"), again);
    });
  }
}

TEST_F(uring_submission, a_persistent_failure_returns_an_error_instead_of_looping) {
  for (int err : {ENOMEM, EAGAIN, EBUSY}) {
    syscall_table t = real_syscalls();
    t.uring_submit_and_wait = [err](void*, unsigned) { return -err; };
    scoped_syscalls guard(t);
    within_deadline(60, [&] {
      file_handle f(dir_ / "f", open_mode::read_write, {}, uring_settings());
      std::vector<std::uint8_t> back(data_.size());
      EXPECT_EQ(code_of([&] { f.pread(back.data(), back.size(), 0); }), errno_code(err));
      EXPECT_EQ(code_of([&] { f.pwrite(back.data(), back.size(), 0); }), errno_code(err));
    });
  }
  EXPECT_EQ(test::read_file(dir_ / "f"), data_) << "a write that never ran changed the file";
}

// A cache drop writes dirty pages first; when that fails the drop is not cold and the error must be seen.
TEST(file_faults, drop_cache_reports_a_failed_fdatasync) {
  temp_dir dir;
  test::write_file(dir / "d", random_bytes(100000, 5));
  std::atomic<int> fadvises{0};
  syscall_table t = real_syscalls();
  t.fdatasync = [](int) {
    errno = EIO;
    return -1;
  };
  t.fadvise = [&](int fd, off_t o, off_t n, int advice) {
    ++fadvises;
    return real_syscalls().fadvise(fd, o, n, advice);
  };
  scoped_syscalls guard(t);
  file_handle w(dir / "d", open_mode::read_write);
  EXPECT_EQ(code_of([&] { w.drop_cache(); }), std::errc::io_error);
  EXPECT_EQ(fadvises.load(), 0) << "the cache was dropped although its dirty pages were not written";
  // A read-only handle has nothing to write: the drop goes ahead.
  file_handle r(dir / "d", open_mode::read);
  EXPECT_NO_THROW(r.drop_cache());
  EXPECT_EQ(fadvises.load(), 1);
}

// close(2) errors (deferred write errors on NFS, EIO) reach the caller of close(); the destructor logs them.
TEST(file_faults, close_reports_what_the_kernel_said) {
  temp_dir dir;
  test::write_file(dir / "c", random_bytes(5000, 6));
  std::atomic<int> closes{0};
  syscall_table t = real_syscalls();
  t.close = [&](int fd) {
    ++closes;
    real_syscalls().close(fd);
    errno = EIO;
    return -1;
  };
  scoped_syscalls guard(t);
  settings s;
  s.direct = direct_mode::off;
  file_handle f(dir / "c", open_mode::read_write, {}, s);
  try {
    f.close();
    FAIL() << "a failed close must throw";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::io_error);
    EXPECT_EQ(e.operation(), "close");
    EXPECT_EQ(e.path(), (dir / "c").string());
  }
  EXPECT_EQ(closes.load(), 1);
  EXPECT_FALSE(f.is_open());
  EXPECT_NO_THROW(f.close());  // empty now: nothing to close
  EXPECT_EQ(closes.load(), 1);
  ::testing::internal::CaptureStderr();
  { file_handle g(dir / "c", open_mode::read, {}, s); }  // must not throw
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(closes.load(), 2);
  EXPECT_FALSE(logged.empty()) << "a close error in the destructor vanished without a trace";
}

TEST(file_faults, close_waits_for_asynchronous_operations) {
  temp_dir dir;
  auto data = random_bytes(50000, 7);
  test::write_file(dir / "w", data);
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  syscall_table t = real_syscalls();
  t.pread = [released](int fd, void* b, std::size_t n, off_t o) {
    released.wait();
    return real_syscalls().pread(fd, b, n, o);
  };
  // The same hold on io_uring, where the asynchronous forms run by default.
  t.uring_result = [released](bool, int, std::uint64_t, std::size_t, int result) {
    released.wait();
    return result;
  };
  scoped_syscalls guard(t);
  settings s;
  s.direct = direct_mode::off;
  file_handle f(dir / "w", open_mode::read, {}, s);
  std::vector<std::uint8_t> back(data.size());
  auto fut = f.pread_async(back.data(), back.size(), 0);
  auto closing = std::async(std::launch::async, [&] { f.close(); });
  EXPECT_EQ(closing.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "close() returned while a read was in flight";
  go.set_value();
  closing.get();
  EXPECT_EQ(fut.get(), data.size());
  EXPECT_EQ(back, data);
}

TEST(error, message_names_operation_path_offset_and_size) {
  error e(errno_code(EIO), "pread", "model.safetensors", 4096, 1048576);
  EXPECT_STREQ(e.what(), "pread \"model.safetensors\" at 4096+1048576: Input/output error");
  EXPECT_EQ(e.code(), std::errc::io_error);
}

TEST(error, cufile_byte_counts_decode) {
  EXPECT_EQ(decode_cufile_ssize(-1, EIO), std::errc::io_error);
  EXPECT_EQ(decode_cufile_ssize(-5027, 0), cufile_code(5027));
  EXPECT_EQ(decode_cufile_ssize(-5, 0), std::errc::io_error);
  EXPECT_FALSE(decode_cufile_ssize(10, 0));
  EXPECT_NE(cufile_code(5027).message().find("not registered"), std::string::npos);
}

TEST(settings, parse_sizes) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4K"), 4096u);
  EXPECT_EQ(parse_size("4KiB"), 4096u);
  EXPECT_EQ(parse_size("8M"), 8u << 20);
  EXPECT_EQ(parse_size("1G"), 1u << 30);
  EXPECT_EQ(parse_size("1.5G"), 3u << 29);
  EXPECT_EQ(parse_size("7B"), 7u);
  EXPECT_FALSE(parse_size(""));
  EXPECT_FALSE(parse_size("-1"));
  EXPECT_FALSE(parse_size("12Q"));
  EXPECT_FALSE(parse_size("99999999999999999999"));
  EXPECT_FALSE(parse_size("1KX"));
}

TEST(settings, environment_overrides_and_errors) {
  test::settings_guard guard;
  ::setenv("GDSKIT_THREADS", "3", 1);
  ::setenv("GDSKIT_CHUNK_BYTES", "1M", 1);
  ::setenv("GDSKIT_DIRECT", "off", 1);
  ::setenv("GDSKIT_ENGINE", "threads", 1);
  ::setenv("GDSKIT_MODE", "staged", 1);
  ::setenv("GDSKIT_DIRECT_DEPTH", "2", 1);
  ::setenv("GDSKIT_STAGING_SLOT_BYTES", "16M", 1);
  ::setenv("GDSKIT_CACHED_SLOT_BYTES", "1M", 1);
  settings s = settings::from_env();
  EXPECT_EQ(s.direct_depth, 2u);
  EXPECT_EQ(s.staging_slot_bytes, 16u << 20);
  EXPECT_EQ(s.cached_slot_bytes, 1u << 20);
  ::setenv("GDSKIT_CACHED_SLOT_BYTES", "60K", 1);  // below 64 KiB
  EXPECT_THROW(settings::from_env(), error);
  ::setenv("GDSKIT_CACHED_SLOT_BYTES", "1M", 1);
  EXPECT_EQ(s.threads, 3u);
  EXPECT_EQ(s.chunk_bytes, 1u << 20);
  EXPECT_EQ(s.direct, direct_mode::off);
  EXPECT_EQ(s.engine, engine_kind::threads);
  EXPECT_EQ(s.mode, path_mode::staged);
  ::setenv("GDSKIT_ENGINE", "fast", 1);
  try {
    settings::from_env();
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("GDSKIT_ENGINE"), std::string::npos);
  }
  ::setenv("GDSKIT_ENGINE", "auto", 1);
  ::setenv("GDSKIT_CHUNK_BYTES", "1000", 1);
  EXPECT_THROW(settings::from_env(), error);
  for (const char* v : {"GDSKIT_THREADS", "GDSKIT_CHUNK_BYTES", "GDSKIT_DIRECT", "GDSKIT_ENGINE", "GDSKIT_MODE",
                        "GDSKIT_DIRECT_DEPTH", "GDSKIT_STAGING_SLOT_BYTES", "GDSKIT_CACHED_SLOT_BYTES"}) {
    ::unsetenv(v);
  }
}

// A destination off the O_DIRECT alignment (a torch CPU tensor is 64-byte aligned) is read through aligned bounce
// buffers. With either engine those reads run in parallel on the workers, not one after another on the thread
// that submits, and every byte lands where it should.
TEST(misaligned_destination, direct_reads_through_bounce_buffers_run_in_parallel) {
  if (!io_uring_unavailable_reason().empty()) GTEST_SKIP() << "io_uring unavailable: " << io_uring_unavailable_reason();
  const auto parent = test::direct_capable_parent();
  if (parent.empty()) GTEST_SKIP() << "no folder here accepts O_DIRECT";
  temp_dir dir(parent);
  const auto data = random_bytes(8u << 20, 91);
  test::write_file(dir / "f", data);
  std::atomic<int> now{0}, most{0};
  syscall_table t = real_syscalls();
  t.pread = [&](int fd, void* b, std::size_t n, off_t o) -> ssize_t {
    const int in = ++now;
    for (int m = most.load(); in > m && !most.compare_exchange_weak(m, in);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // long enough for the others to start
    const ssize_t r = real_syscalls().pread(fd, b, n, o);
    --now;
    return r;
  };
  scoped_syscalls guard(t);
  for (engine_kind e : {engine_kind::io_uring, engine_kind::threads}) {
    SCOPED_TRACE(std::string(to_string(e)));
    settings s;
    s.engine = e;
    s.direct = direct_mode::on;
    s.threads = 4;
    s.direct_depth = 4;
    s.direct_depth_set = true;
    s.chunk_bytes = 1u << 20;
    s.chunk_bytes_set = true;
    file_handle f(dir / "f", open_mode::read, {}, s);
    ASSERT_TRUE(f.choice().direct) << f.choice().direct_reason;
    std::vector<std::uint8_t> back(data.size() + 4096 + 64);
    std::uint8_t* dst = back.data() + (4096 - reinterpret_cast<std::uintptr_t>(back.data()) % 4096) + 64;
    most = 0;
    ASSERT_EQ(f.pread(dst, data.size() - 100, 50), data.size() - 100);
    EXPECT_EQ(std::memcmp(dst, data.data() + 50, data.size() - 100), 0);
    EXPECT_GE(most.load(), 3) << "bounced O_DIRECT reads ran one at a time";
    const std::string why = f.plan(buffer_view::host(dst, data.size())).summary();
    EXPECT_NE(why.find("not aligned"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace gdskit
