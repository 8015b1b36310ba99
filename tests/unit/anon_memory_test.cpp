// Anonymous I/O memory: 2 MiB aligned, zeroed, faulted in, on transparent huge pages where the kernel gives
// them, and a correct target for O_DIRECT reads of odd sizes.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "posix/anon_memory.hpp"
#include "test_support.hpp"

namespace gdskit::posix {
namespace {

TEST(anon_memory, aligned_zeroed_and_rounded_to_pages) {
  anon_memory m(5 * 4096 + 1);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % (2u << 20), 0u);
  EXPECT_EQ(m.size(), 6u * 4096);
  const auto* b = static_cast<const unsigned char*>(m.data());
  for (std::size_t i = 0; i < m.size(); ++i) ASSERT_EQ(b[i], 0) << i;
  anon_memory moved(std::move(m));
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(moved.size(), 6u * 4096);
  anon_memory empty;
  empty = std::move(moved);
  EXPECT_NE(empty.data(), nullptr);
}

TEST(anon_memory, backed_by_huge_pages_unless_the_kernel_says_never) {
  const std::string mode = transparent_hugepage_mode();
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off here (" << (mode.empty() ? "no sysfs entry" : mode) << ")";
  }
  anon_memory m(16u << 20);
  EXPECT_GE(huge_page_bytes(m.data()), std::size_t{2} << 20) << "THP: " << mode;
  std::vector<unsigned char> small(4096);
  EXPECT_EQ(huge_page_bytes(small.data()), 0u);  // the heap's mapping is not this one
}

TEST(anon_memory, o_direct_reads_into_it_are_byte_exact) {
  test::temp_dir dir(test::direct_capable_parent());
  const auto data = test::random_bytes((5u << 20) + 777, 17);
  test::write_file(dir / "d", data);
  const int fd = ::open((dir / "d").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "O_DIRECT refused here";
  anon_memory m(6u << 20);
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t r = ::pread(fd, static_cast<char*>(m.data()) + got, (1u << 20), static_cast<off_t>(got));
    ASSERT_GT(r, 0);
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  EXPECT_EQ(got, data.size());
  EXPECT_EQ(std::memcmp(m.data(), data.data(), data.size()), 0);
}

}  // namespace
}  // namespace gdskit::posix
