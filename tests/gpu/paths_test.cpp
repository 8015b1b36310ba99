// Byte-exact round trips between files and GPU memory on every path, with random data, odd sizes, unaligned
// offsets, registered and unregistered buffers. Skips with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <fstream>
#include <future>
#include <functional>
#include <random>
#include <thread>

#include "gdskit/batch.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/settings.hpp"
#include "gpu/cuda_raii.hpp"
#include "posix/anon_memory.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/cufile.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

using test::random_bytes;
using test::temp_dir;

#define REQUIRE_GPU()                                                  \
  do {                                                                 \
    std::string reason_;                                               \
    if (!gpu_available(&reason_)) GTEST_SKIP() << "no usable GPU: " << reason_; \
  } while (0)

settings with_mode(path_mode m) {
  settings s = default_settings();
  s.mode = m;
  return s;
}

std::vector<std::uint8_t> device_to_host(const device_buffer& d, std::size_t n, std::size_t off = 0) {
  std::vector<std::uint8_t> out(n);
  if (n > 0) d.copy_to_host(out.data(), n, off);
  return out;
}

void round_trips(path_mode mode, bool big, bool register_buffers = false) {
  temp_dir dir(test::direct_capable_parent());
  std::mt19937_64 rng(static_cast<std::uint64_t>(mode) + 11);
  std::vector<std::size_t> sizes = {1, 7, 4095, 4096, 4097, 65537, (1u << 20) + 1, (37u << 20) + 4095};
  if (big) sizes.push_back((std::size_t{4} << 30) + 1);  // 4 GiB + 1
  for (std::size_t size : sizes) {
    auto data = random_bytes(size, size + 3);
    auto path = dir / ("f" + std::to_string(size));
    test::write_file(path, data);
    file_handle f(path, open_mode::read_write, {}, with_mode(mode));
    device_buffer d(size + 8192);
    cufile_registration reg;
    if (register_buffers) reg = cufile_registration(d.view());
    // Whole file, then unaligned pieces into unaligned device offsets.
    for (int r = 0; r < (big && size > (1u << 30) ? 1 : 6); ++r) {
      std::uint64_t off = r == 0 ? 0 : rng() % size;
      std::size_t len = r == 0 ? size : static_cast<std::size_t>(rng() % (size - off + 5000)) + 1;
      std::size_t dev_off = r == 0 ? 0 : static_cast<std::size_t>(rng() % 4096);
      d.fill(0xEE);
      std::size_t got = f.read(d.view().sub(dev_off, std::min(len, size + 8192 - dev_off)), std::min(len, size + 8192 - dev_off), off);
      std::size_t expect = std::min<std::size_t>(std::min(len, size + 8192 - dev_off), size - off);
      ASSERT_EQ(got, expect) << "mode " << to_string(mode) << " size " << size << " off " << off;
      auto back = device_to_host(d, got, dev_off);
      ASSERT_EQ(0, std::memcmp(back.data(), data.data() + off, got)) << "mode " << to_string(mode) << " size " << size;
    }
    // Write from GPU memory at an unaligned offset, read back with plain pread.
    auto fresh = random_bytes(size, size + 99);
    d.copy_from_host(fresh.data(), size, 1);
    std::uint64_t woff = size > 10 ? 3 : 0;
    ASSERT_EQ(f.write(d.view().sub(1, size), size, woff), size);
    auto disk = test::read_file(path);
    ASSERT_GE(disk.size(), woff + size);
    ASSERT_EQ(0, std::memcmp(disk.data() + woff, fresh.data(), size)) << "write mode " << to_string(mode) << " size " << size;
    std::filesystem::remove(path);
  }
}

TEST(gpu_paths, staged_round_trips) {
  REQUIRE_GPU();
  round_trips(path_mode::staged, /*big=*/std::getenv("GDSKIT_GPU_TEST_BIG") != nullptr);
}

TEST(gpu_paths, auto_picks_a_path_with_reasons) {
  REQUIRE_GPU();
  temp_dir dir(test::direct_capable_parent());
  test::write_file(dir / "p", random_bytes(4096, 1));
  file_handle f(dir / "p", open_mode::read, {}, with_mode(path_mode::automatic));
  device_buffer d(4096);
  path_decision p = f.plan(d.view());
  EXPECT_FALSE(p.reasons.empty()) << p.summary();
  std::cout << "plan: " << p.summary() << "\n";
  EXPECT_EQ(f.read(d.view(), 4096, 0), 4096u);
}

std::filesystem::path udev_entry_for(const std::filesystem::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return {};
  return "/run/udev/data/b" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
}

// The udev entry cuFile needs for a file's device; created for the object's life where it is missing (only as
// root), with the folders made for it.
class udev_entry {
 public:
  explicit udev_entry(const std::filesystem::path& file) : entry_(udev_entry_for(file)) {}
  udev_entry(const udev_entry&) = delete;
  udev_entry& operator=(const udev_entry&) = delete;
  ~udev_entry() {
    for (const auto& p : created_) {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  }
  bool exists() const { return std::filesystem::exists(entry_); }
  const std::filesystem::path& path() const { return entry_; }
  // False when it cannot be created here (not root).
  bool create() {
    if (::geteuid() != 0) return false;
    for (auto p = entry_.parent_path(); !std::filesystem::exists(p); p = p.parent_path()) created_.push_back(p);
    std::filesystem::create_directories(entry_.parent_path());
    std::ofstream(entry_) << "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n";
    created_.insert(created_.begin(), entry_);
    return true;
  }

 private:
  std::filesystem::path entry_;
  std::vector<std::filesystem::path> created_;
};

// cuFile registers a file only when udev describes its device. Without the entry: error 5027 and a planner
// reason naming udev; with it (created here when running as root): compat round trips, registered or not.
TEST(gpu_paths, cufile_with_and_without_udev_data) {
  REQUIRE_GPU();
  std::string reason;
  if (shim::cufile(&reason) == nullptr) GTEST_SKIP() << "cuFile unusable: " << reason;
  temp_dir dir(test::direct_capable_parent());
  test::write_file(dir / "u", random_bytes(1u << 20, 4));
  udev_entry entry(dir / "u");
  if (!entry.exists()) {
    file_handle f(dir / "u", open_mode::read, {}, with_mode(path_mode::compat));
    device_buffer d(1u << 20);
    settings auto_mode = with_mode(path_mode::automatic);
    file_handle g(dir / "u", open_mode::read, {}, auto_mode);
    path_decision p = g.plan(d.view());
    EXPECT_TRUE(std::any_of(p.reasons.begin(), p.reasons.end(), [](const std::string& r) { return r.find("udev") != std::string::npos; }))
        << p.summary();
    try {
      f.read(d.view(), 1u << 20, 0);
      FAIL() << "cuFile registered a file without udev data";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), cufile_code(5027)) << e.what();
    }
    if (!entry.create()) GTEST_SKIP() << "not root: cannot create " << entry.path() << " to test the registered case";
  }
  round_trips(path_mode::compat, false, false);
  round_trips(path_mode::compat, false, true);
  // cuFile's mode is per process and this one forced compat: a gds transfer is refused, not run as compat.
  file_handle g(dir / "u", open_mode::read, {}, with_mode(path_mode::gds));
  device_buffer d(4096);
  try {
    g.read(d.view(), 4096, 0);
    ADD_FAILURE() << "gds after forced compat must be refused";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::not_supported) << e.what();
  }
}

TEST(gpu_buffers, foreign_and_bad_pointers) {
  REQUIRE_GPU();
  device_buffer d(1u << 20);
  buffer_view v = describe_pointer(d.data(), 1u << 20);
  EXPECT_EQ(v.kind, memory_kind::device);
  EXPECT_EQ(v.device, 0);
  EXPECT_THROW(describe_pointer(d.data(), (1u << 20) + 1), error);  // larger than the allocation
  std::vector<char> host(100);
  EXPECT_EQ(describe_pointer(host.data(), host.size()).kind, memory_kind::host);
  pinned_buffer pin(4096);
  EXPECT_EQ(describe_pointer(pin.data(), 4096).kind, memory_kind::pinned);
  temp_dir dir;
  test::write_file(dir / "s", random_bytes(100, 1));
  file_handle f(dir / "s", open_mode::read);
  EXPECT_THROW(f.read(d.view().sub(0, 10), 100, 0), error);  // buffer too small for the request
  EXPECT_EQ(f.read(d.view(), 1000, 0), 100u);               // short file: the bytes that exist
  EXPECT_THROW(f.read_exact(d.view(), 1000, 0), short_read_error);
}

// Pinned memory is registered anonymous memory on huge pages where the kernel gives them; O_DIRECT reads into
// it and the copies from it are byte-exact.
TEST(gpu_buffers, pinned_memory_on_huge_pages) {
  REQUIRE_GPU();
  pinned_buffer pin(16u << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pin.data()) % (2u << 20), 0u);
  EXPECT_EQ(describe_pointer(pin.data(), pin.size()).kind, memory_kind::pinned);
  const std::string mode = posix::transparent_hugepage_mode();
  if (mode.find("[never]") == std::string::npos && !mode.empty()) {
    EXPECT_GT(pin.huge_page_bytes(), 0u) << "THP is " << mode;
  }
  temp_dir dir(test::direct_capable_parent());
  auto data = random_bytes((12u << 20) + 4097, 61);
  test::write_file(dir / "h", data);
  file_handle f(dir / "h", open_mode::read);
  EXPECT_EQ(f.read(pin.view(), data.size(), 0), data.size());
  EXPECT_EQ(std::memcmp(pin.data(), data.data(), data.size()), 0);
  device_buffer d(data.size());
  d.copy_from_host(pin.data(), data.size());
  EXPECT_EQ(device_to_host(d, data.size()), data);
}

shim::CUcontext current_context() {
  shim::CUcontext c = nullptr;
  shim::cuda()->cuCtxGetCurrent(&c);
  return c;
}

// gdskit's buffers and paths use the context they need and give the thread back as they found it.
TEST(gpu_resources, context_is_restored_after_every_call) {
  REQUIRE_GPU();
  std::thread([] {
    ASSERT_EQ(current_context(), nullptr) << "a fresh thread starts without a context";
    {
      device_buffer d(1u << 20);
      EXPECT_EQ(current_context(), nullptr) << "device_buffer left a context current";
      d.fill(7);
      std::vector<std::uint8_t> back(16);
      d.copy_to_host(back.data(), back.size());
      EXPECT_EQ(back[0], 7);
      pinned_buffer pin(1u << 20);
      temp_dir dir(test::direct_capable_parent());
      test::write_file(dir / "c", random_bytes(1u << 20, 8));
      file_handle f(dir / "c", open_mode::read_write, {}, with_mode(path_mode::staged));
      EXPECT_EQ(f.read(d.view(), 1u << 20, 0), 1u << 20);
      EXPECT_EQ(f.write(d.view(), 1u << 20, 0), 1u << 20);
      EXPECT_EQ(current_context(), nullptr);
    }
    EXPECT_EQ(current_context(), nullptr) << "a destructor left a context current";
    {
      gpu::context_guard g(0);
      EXPECT_NE(current_context(), nullptr);
      EXPECT_EQ(current_context(), shim::primary_context(0));
      { gpu::context_guard nested(0); }
      EXPECT_EQ(current_context(), shim::primary_context(0)) << "a nested guard popped more than it pushed";
    }
    EXPECT_EQ(current_context(), nullptr);
  }).join();
}

TEST(gpu_resources, streams_and_events_move_and_destroy) {
  REQUIRE_GPU();
  gpu::cuda_stream s(0, shim::CU_STREAM_NON_BLOCKING);
  ASSERT_TRUE(s);
  const shim::CUstream raw = s.get();
  gpu::cuda_stream moved(std::move(s));
  EXPECT_FALSE(s);
  EXPECT_EQ(s.device(), -1);
  EXPECT_EQ(moved.get(), raw);
  gpu::cuda_stream other(0, 0);
  other = std::move(moved);  // frees other's own stream, takes moved's
  EXPECT_EQ(other.get(), raw);
  EXPECT_FALSE(moved);
  gpu::cuda_event e(0, shim::CU_EVENT_DISABLE_TIMING);
  {
    gpu::context_guard g(0);
    EXPECT_EQ(shim::cuda()->cuEventRecord(e.get(), other.get()), shim::CUDA_SUCCESS);
    EXPECT_EQ(shim::cuda()->cuEventSynchronize(e.get()), shim::CUDA_SUCCESS);
  }
  gpu::cuda_event e2(std::move(e));
  EXPECT_FALSE(e);
  EXPECT_TRUE(e2);
  e2.reset();
  EXPECT_FALSE(e2);
  device_buffer d(4096);
  device_buffer d2(std::move(d));
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_NE(d2.data(), nullptr);
  pinned_buffer p(4096);
  pinned_buffer p2;
  p2 = std::move(p);
  EXPECT_EQ(p.data(), nullptr);
  EXPECT_NE(p2.data(), nullptr);
}

TEST(gpu_paths, buffer_view_async_forms_with_device_memory) {
  REQUIRE_GPU();
  temp_dir dir(test::direct_capable_parent());
  auto data = random_bytes((3u << 20) + 17, 51);
  test::write_file(dir / "as", data);
  device_buffer d(data.size() + 4096);
  io_future r;
  {
    file_handle f(dir / "as", open_mode::read_write, {}, with_mode(path_mode::staged));
    r = f.read_async(d.view(), d.size(), 0);
  }
  EXPECT_EQ(r.get(), data.size());
  EXPECT_EQ(device_to_host(d, data.size()), data);
  file_handle f(dir / "as", open_mode::read_write, {}, with_mode(path_mode::staged));
  EXPECT_EQ(f.write_async(d.view().sub(1, 100000), 100000, 4097).get(), 100000u);
  auto disk = test::read_file(dir / "as");
  EXPECT_EQ(0, std::memcmp(disk.data() + 4097, data.data() + 1, 100000));
}

// Batches of many ranges between a file and GPU memory at odd sizes, unaligned file offsets and unaligned
// device addresses, through both ways of copying small pieces (one copy kernel per group, or the copy engines),
// and with every piece through the kernel (`kernel_bytes`: its largest piece): reads land byte-exact and leave
// the bytes between ranges alone; writes from GPU memory put every byte in place.
// `pick`, where given, draws every range's length (else a mix of sizes below).
void batch_round_trip(bool kernel, const char* kernel_bytes = nullptr,
                      const std::function<std::size_t(std::mt19937_64&)>& pick = {}) {
  test::settings_guard keep;
  set_setting("copy_kernel", kernel ? "on" : "off");
  if (kernel_bytes != nullptr) set_setting("copy_kernel_bytes", kernel_bytes);
  temp_dir dir(test::direct_capable_parent());
  std::mt19937_64 rng(kernel ? 71 : 72);
  const auto data = random_bytes((24u << 20) + 333, 73);
  test::write_file(dir / "src", data);
  constexpr std::size_t n = 3000;
  std::vector<std::size_t> len(n), at(n);
  std::vector<std::uint64_t> off(n);
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    // Mostly kernel-sized pieces, some for the copy engines, some 1-byte and some 16-byte aligned.
    const std::size_t r = rng() % 100;
    len[i] = pick ? pick(rng) : r < 5 ? 1 : r < 85 ? 1 + rng() % 9000 : r < 95 ? 4096 * (1 + rng() % 8) : 65536 + rng() % 200000;
    off[i] = rng() % (data.size() - len[i]);
    if (r >= 85 && r < 95) off[i] &= ~std::uint64_t{4095};
    total += (rng() % 40) + 1;  // a gap before each range: untouched bytes must stay as they were
    at[i] = total;
    total += len[i];
  }
  device_buffer d(total + 64);
  std::vector<std::uint8_t> fill(total + 64, 0x5A);
  d.copy_from_host(fill.data(), fill.size(), 0);
  file_handle f(dir / "src", open_mode::read);
  std::vector<io_range> ranges;
  for (std::size_t i = 0; i < n; ++i) ranges.push_back({&f, off[i], d.view().sub(at[i], len[i])});
  const batch_result r = read_batch(ranges);
  ASSERT_TRUE(r.ok()) << r.failed << " ranges failed";
  auto back = device_to_host(d, total + 64);
  std::vector<std::uint8_t> want = fill;
  for (std::size_t i = 0; i < n; ++i) std::memcpy(want.data() + at[i], data.data() + off[i], len[i]);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(0, std::memcmp(back.data() + at[i], want.data() + at[i], len[i])) << "range " << i << " of " << len[i];
  }
  ASSERT_EQ(back, want) << "bytes between ranges changed";

  // Writes: the same device pieces to consecutive places of a new file, each at an odd offset.
  const auto dst = dir / "dst";
  std::vector<std::uint8_t> expect(total + 4096, 0);
  test::write_file(dst, expect);
  file_handle w(dst, open_mode::read_write);
  std::vector<io_range> writes;
  for (std::size_t i = 0; i < n; ++i) {
    writes.push_back({&w, at[i] + 7, d.view().sub(at[i], len[i])});
    std::memcpy(expect.data() + at[i] + 7, want.data() + at[i], len[i]);
  }
  const batch_result wr = write_batch(writes);
  ASSERT_TRUE(wr.ok()) << wr.failed << " ranges failed";
  w.sync();
  EXPECT_EQ(test::read_file(dst), expect);
}

TEST(gpu_paths, batches_through_the_copy_kernel) {
  REQUIRE_GPU();
  batch_round_trip(true);
}

TEST(gpu_paths, batches_with_every_piece_through_the_copy_kernel) {
  REQUIRE_GPU();
  batch_round_trip(true, "64M");
}

// Pieces of exactly copy_kernel_bytes go to the kernel and one byte more to the engines: both sides of the
// bound land byte for byte, reads and writes, at 4 KiB-aligned and odd offsets.
TEST(gpu_paths, batches_with_pieces_at_the_copy_kernels_bound) {
  REQUIRE_GPU();
  batch_round_trip(true, "16K", [](std::mt19937_64& rng) { return std::size_t{16384} - 1 + rng() % 3; });
}

TEST(gpu_paths, batches_through_the_copy_engines) {
  REQUIRE_GPU();
  batch_round_trip(false);
}

// Memory said to be on a GPU this process does not see is refused before any I/O, naming the item; the real
// device's memory in the same batch is never touched.
TEST(gpu_paths, a_batch_naming_a_gpu_that_is_not_there_is_refused_before_any_io) {
  REQUIRE_GPU();
  temp_dir dir;
  test::write_file(dir / "f", random_bytes(1 << 16, 31));
  file_handle f(dir / "f", open_mode::read);
  device_buffer mem(1 << 16, 0);
  const int missing = gpu_count();
  const io_range ranges[] = {{&f, 0, mem.view().sub(0, 4096)},
                             {&f, 4096, buffer_view{static_cast<std::uint8_t*>(mem.data()) + 8192, 4096,
                                                    memory_kind::device, missing}}};
  try {
    read_batch(ranges);
    ADD_FAILURE() << "memory of GPU " << missing << " was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errno_code(ENODEV)) << e.what();
    EXPECT_NE(std::string(e.what()).find("item 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gdskit

namespace gdskit {
namespace {

// GDSKIT_MODE=compat must run cuFile's compat mode, not the default configuration: the counters after the
// transfer say posix for every request. Run first in its own process (cuFile's mode is per process):
//   build/ci/tests/gpu_paths_test --gtest_filter=gpu_paths.forced_compat_is_compat_by_the_counters
TEST(gpu_paths, forced_compat_is_compat_by_the_counters) {
  REQUIRE_GPU();
  std::string reason;
  if (shim::cufile(&reason) == nullptr) GTEST_SKIP() << "no libcufile: " << reason;
  if (shim::cufile_driver_opened()) GTEST_SKIP() << "cuFile already open in this process: run this test alone";
  if (!shim::cufile_enable_stats()) GTEST_SKIP() << "this libcufile has no level-3 statistics";
  temp_dir dir(test::direct_capable_parent());
  const std::size_t size = 8u << 20;
  auto data = random_bytes(size, 5);
  test::write_file(dir / "f", data);
  udev_entry udev(dir / "f");
  if (!udev.exists() && !udev.create()) {
    GTEST_SKIP() << "no udev data for the test file's device (" << udev.path()
                 << ") and not root to create it: cuFile cannot register the file";
  }
  file_handle f(dir / "f", open_mode::read, {}, with_mode(path_mode::compat));
  device_buffer d(size);
  EXPECT_EQ(f.plan(d.view()).path, data_path::compat);
  const auto before = shim::cufile_read_counters();
  ASSERT_EQ(f.read(d.view(), size, 0), size);
  const auto after = shim::cufile_read_counters();
  EXPECT_EQ(device_to_host(d, size), data);
  ASSERT_TRUE(after.available);
  EXPECT_GT(after.reads - before.reads, 0u);
  EXPECT_EQ(after.posix_reads - before.posix_reads, after.reads - before.reads);
  EXPECT_EQ(after.p2p_reads - before.p2p_reads, 0u);
  EXPECT_EQ(after.nvfs_reads - before.nvfs_reads, 0u);
  // The process is now in compat mode: a gds transfer is refused, not run under a false label.
  file_handle g(dir / "f", open_mode::read, {}, with_mode(path_mode::gds));
  try {
    g.read(d.view(), 4096, 0);
    ADD_FAILURE() << "gds after forced compat must be refused";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::not_supported);
  }
}

}  // namespace
}  // namespace gdskit
