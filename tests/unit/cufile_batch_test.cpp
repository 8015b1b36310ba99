// The cuFile batch route against a stand-in libcufile (tests/support/fake_cufile.cpp), loaded by path: this
// machine has no GDS, so the real library's batch API is unproven here (docs/batch.md says so). Entries split
// into cuFile batches of at most 128, each entry's status read on its own, completions collected with a
// timeout, a stop that cancels, and a library that never hands entries back.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "gdskit/error.hpp"
#include "gpu/cufile_batch.hpp"
#include "shim/cufile.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using namespace std::chrono_literals;
using test::random_bytes;

struct fake {
  shim::cufile_api api{};
  void (*set)(long long, int, bool) = nullptr;
  void (*observed)(unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
  unsigned (*live)() = nullptr;
  int (*opens)(bool*) = nullptr;
  bool load() {
    std::string reason;
    if (!shim::load_cufile_at(GDSKIT_FAKE_CUFILE, api, &reason)) {
      ADD_FAILURE() << reason;
      return false;
    }
    void* lib = ::dlopen(GDSKIT_FAKE_CUFILE, RTLD_NOW | RTLD_LOCAL);
    set = reinterpret_cast<decltype(set)>(::dlsym(lib, "fake_cufile_set"));
    observed = reinterpret_cast<decltype(observed)>(::dlsym(lib, "fake_cufile_observed"));
    live = reinterpret_cast<decltype(live)>(::dlsym(lib, "fake_cufile_live_batches"));
    opens = reinterpret_cast<decltype(opens)>(::dlsym(lib, "fake_cufile_opens"));
    set(-1, 0, false);
    return set && observed && live && opens && api.has_batch();
  }
};

struct cufile_batch_fixture : ::testing::Test {
  test::temp_dir dir;
  fake f;
  shim::CUfileHandle_t fh = nullptr;
  int fd = -1;
  void SetUp() override {
    ASSERT_TRUE(f.load());
  }
  void open(const std::filesystem::path& p, int flags) {
    fd = ::open(p.c_str(), flags, 0644);
    ASSERT_GE(fd, 0);
    shim::CUfileDescr_t d{};
    d.type = shim::CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    ASSERT_EQ(f.api.cuFileHandleRegister(&fh, &d).err, shim::CU_FILE_SUCCESS);
  }
  void TearDown() override {
    if (fh != nullptr) f.api.cuFileHandleDeregister(fh);
    if (fd >= 0) ::close(fd);
  }
};

TEST_F(cufile_batch_fixture, many_entries_in_batches_of_at_most_128_each_checked_on_its_own) {
  const auto data = random_bytes(4 << 20, 1);
  test::write_file(dir / "f", data);
  open(dir / "f", O_RDONLY);
  constexpr std::size_t n = 1000;
  std::vector<std::uint8_t> mem(n * 4096, 0);
  std::vector<gpu::cufile_batch_entry> entries;
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> offs(n);
  for (std::size_t k = 0; k < n; ++k) {
    offs[k] = (rng() % 1000) * 4096;
    entries.push_back({fh, false, mem.data(), k * 4096, offs[k], 4096});
  }
  const std::uint64_t bad = offs[500];
  f.set(static_cast<long long>(bad), 1, false);
  std::vector<std::size_t> bytes(n, 999);
  std::vector<std::error_code> errs(n);
  std::vector<int> calls(n, 0);
  gpu::run_cufile_batch(f.api, entries, [] { return false; }, [&](std::size_t k, std::size_t b, std::error_code ec) {
    ++calls[k];
    bytes[k] = b;
    errs[k] = ec;
  });
  for (std::size_t k = 0; k < n; ++k) {
    ASSERT_EQ(calls[k], 1) << "entry " << k << " reported " << calls[k] << " times";
    if (offs[k] == bad) {
      EXPECT_EQ(errs[k], errno_code(EIO)) << "a failed entry must not pass as success";
      continue;
    }
    ASSERT_FALSE(errs[k]) << k;
    ASSERT_EQ(bytes[k], 4096u);
    ASSERT_EQ(0, std::memcmp(mem.data() + k * 4096, data.data() + offs[k], 4096)) << k;
  }
  unsigned max_setup = 0, untimed = 0, setups = 0, cancels = 0;
  f.observed(&max_setup, &untimed, &setups, &cancels);
  EXPECT_LE(max_setup, shim::k_cufile_batch_max);
  EXPECT_GE(setups, (n + 127) / 128);
  EXPECT_EQ(untimed, 0u) << "waited for a whole batch without a timeout";
  EXPECT_EQ(f.live(), 0u) << "cuFile batches left undestroyed";
}

TEST_F(cufile_batch_fixture, writes_land) {
  open(dir / "w", O_RDWR | O_CREAT | O_TRUNC);
  const auto src = random_bytes(300 * 1000, 2);
  std::vector<gpu::cufile_batch_entry> entries;
  for (std::size_t k = 0; k < 300; ++k) entries.push_back({fh, true, const_cast<std::uint8_t*>(src.data()), k * 1000, k * 1000, 1000});
  std::atomic<int> failed{0};
  gpu::run_cufile_batch(f.api, entries, [] { return false; },
                        [&](std::size_t, std::size_t b, std::error_code ec) { failed += (ec || b != 1000) ? 1 : 0; });
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(test::read_file(dir / "w"), src);
}

TEST_F(cufile_batch_fixture, stop_cancels_entries_the_library_holds) {
  test::write_file(dir / "f", random_bytes(1 << 20, 4));
  open(dir / "f", O_RDONLY);
  f.set(-1, 0, true);  // nothing completes until cancelled
  std::vector<std::uint8_t> mem(400 * 512);
  std::vector<gpu::cufile_batch_entry> entries;
  for (std::size_t k = 0; k < 400; ++k) entries.push_back({fh, false, mem.data(), k * 512, k * 512, 512});
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    stop = true;
  });
  std::vector<std::error_code> errs(400);
  std::vector<int> calls(400, 0);
  const auto t0 = std::chrono::steady_clock::now();
  gpu::run_cufile_batch(f.api, entries, [&] { return stop.load(); }, [&](std::size_t k, std::size_t, std::error_code ec) {
    ++calls[k];
    errs[k] = ec;
  });
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  std::size_t cancelled = 0, skipped = 0;
  for (std::size_t k = 0; k < 400; ++k) {
    if (calls[k] == 0) {
      ++skipped;  // never submitted
      continue;
    }
    ASSERT_EQ(calls[k], 1);
    if (errs[k] == errno_code(ECANCELED)) ++cancelled;
  }
  EXPECT_GT(cancelled, 0u);
  EXPECT_EQ(cancelled + skipped, 400u);
  unsigned max_setup = 0, untimed = 0, setups = 0, cancels = 0;
  f.observed(&max_setup, &untimed, &setups, &cancels);
  EXPECT_GT(cancels, 0u);
  EXPECT_EQ(f.live(), 0u);
}

TEST_F(cufile_batch_fixture, no_batch_api_is_refused_clearly) {
  shim::cufile_api none = f.api;
  none.cuFileBatchIOSetUp = nullptr;
  const gpu::cufile_batch_entry e{fh, false, nullptr, 0, 0, 1};
  try {
    gpu::run_cufile_batch(none, std::span(&e, 1), [] { return false; }, [](std::size_t, std::size_t, std::error_code) {});
    FAIL() << "accepted";
  } catch (const error& err) {
    EXPECT_EQ(err.code(), errno_code(ENOTSUP));
  }
}

// cuFile takes its mode when its driver opens, once per process: an opener asked for compat forces it before
// the open, a second call neither opens again nor changes the mode, and an opener asked for the default does
// not force it. (`gdskit bench -x compat` opens the driver early to read its counters: in compat mode.)
TEST(driver_opener, forces_compat_before_the_first_open_and_keeps_that_mode) {
  fake f;
  ASSERT_TRUE(f.load());
  bool compat = false;
  f.opens(&compat);  // reset
  shim::driver_opener compat_first;
  EXPECT_EQ(compat_first.open(f.api, true), shim::CU_FILE_SUCCESS);
  EXPECT_TRUE(compat_first.opened());
  EXPECT_TRUE(compat_first.compat());
  EXPECT_EQ(compat_first.open(f.api, false), shim::CU_FILE_SUCCESS);
  EXPECT_TRUE(compat_first.compat()) << "the mode is the first open's";
  EXPECT_EQ(f.opens(&compat), 1) << "the driver opened more than once";
  EXPECT_TRUE(compat) << "compat was not forced before the open";

  shim::driver_opener plain_first;
  EXPECT_EQ(plain_first.open(f.api, false), shim::CU_FILE_SUCCESS);
  EXPECT_EQ(plain_first.open(f.api, true), shim::CU_FILE_SUCCESS);
  EXPECT_FALSE(plain_first.compat()) << "a later call changed the mode of an open driver";
  EXPECT_EQ(f.opens(&compat), 1);
  EXPECT_FALSE(compat) << "compat forced where the first call did not ask for it";
}

}  // namespace
}  // namespace gdskit
