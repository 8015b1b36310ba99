// GPU buffers and pointer classification without a GPU: pointer classification against a fake driver table,
// and the resource types' empty, moved-from and no-driver behaviour. tests/gpu/paths_test.cpp covers the same
// types on a real GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"
#include "gpu/buffers.hpp"
#include "gpu/cuda_raii.hpp"
#include "shim/cuda_driver.hpp"

namespace gdskit {
namespace {

using shim::CUdeviceptr;
using shim::CUresult;

// What the fake driver answers to cuPointerGetAttribute, per attribute.
struct pointer_answers {
  CUresult memory_type_result = 0;
  unsigned memory_type = shim::CU_MEMORYTYPE_DEVICE;
  CUresult managed_result = 0;
  int managed = 0;
  CUresult ordinal_result = 0;
  int ordinal = 0;
  CUdeviceptr range_start = 0;
  std::size_t range_bytes = 0;
};
pointer_answers answers;

CUresult fake_pointer_attribute(void* out, int attribute, CUdeviceptr) {
  switch (attribute) {
    case shim::CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      if (answers.memory_type_result == 0) *static_cast<unsigned*>(out) = answers.memory_type;
      return answers.memory_type_result;
    case shim::CU_POINTER_ATTRIBUTE_IS_MANAGED:
      if (answers.managed_result == 0) *static_cast<int*>(out) = answers.managed;
      return answers.managed_result;
    case shim::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      if (answers.ordinal_result == 0) *static_cast<int*>(out) = answers.ordinal;
      return answers.ordinal_result;
    case shim::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(out) = answers.range_start;
      return 0;
    case shim::CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(out) = answers.range_bytes;
      return 0;
    default:
      return shim::CUDA_ERROR_INVALID_VALUE;
  }
}

shim::cuda_api fake_driver() {
  shim::cuda_api a{};
  a.cuPointerGetAttribute = &fake_pointer_attribute;
  return a;
}

class pointer_kinds : public ::testing::Test {
 protected:
  void SetUp() override { answers = {}; }
  const shim::cuda_api api_ = fake_driver();
  unsigned char mem_[64] = {};
};

TEST_F(pointer_kinds, memory_the_driver_does_not_know_is_host) {
  answers.memory_type_result = shim::CUDA_ERROR_INVALID_VALUE;
  const buffer_view v = gpu::describe_pointer_with(&api_, mem_, sizeof mem_);
  EXPECT_EQ(v.kind, memory_kind::host);
  EXPECT_EQ(v.device, -1);
  EXPECT_EQ(gpu::describe_pointer_with(nullptr, mem_, sizeof mem_).kind, memory_kind::host) << "no driver: host";
}

TEST_F(pointer_kinds, other_driver_errors_raise_instead_of_passing_for_host) {
  for (CUresult r : {2, 3, 4, 201, 700, 999}) {  // out of memory, not initialized, deinitialized, context, ...
    answers = {};
    answers.memory_type_result = r;
    try {
      gpu::describe_pointer_with(&api_, mem_, sizeof mem_);
      FAIL() << "CUresult " << r << " was taken for host memory";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), cuda_code(r));
    }
  }
  answers = {};
  answers.managed_result = 700;
  try {
    gpu::describe_pointer_with(&api_, mem_, sizeof mem_);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), cuda_code(700));
  }
  answers = {};
  answers.ordinal_result = 999;
  EXPECT_THROW(gpu::describe_pointer_with(&api_, mem_, sizeof mem_), error);
}

TEST_F(pointer_kinds, known_pointers_are_classified_and_bounded) {
  answers.ordinal = 3;
  buffer_view v = gpu::describe_pointer_with(&api_, mem_, sizeof mem_);
  EXPECT_EQ(v.kind, memory_kind::device);
  EXPECT_EQ(v.device, 3);
  answers.memory_type = shim::CU_MEMORYTYPE_HOST;
  EXPECT_EQ(gpu::describe_pointer_with(&api_, mem_, sizeof mem_).kind, memory_kind::pinned);
  answers.managed = 1;
  EXPECT_EQ(gpu::describe_pointer_with(&api_, mem_, sizeof mem_).kind, memory_kind::managed);
  answers = {};
  answers.range_start = reinterpret_cast<CUdeviceptr>(mem_);
  answers.range_bytes = 32;
  try {
    gpu::describe_pointer_with(&api_, mem_ + 8, 32);
    FAIL() << "a range past the allocation must be refused";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
  EXPECT_THROW(gpu::describe_pointer_with(&api_, nullptr, 8), error);
}

// No destructor may throw: a throwing one terminates the process when it runs during unwinding.
static_assert(std::is_nothrow_destructible_v<device_buffer>);
static_assert(std::is_nothrow_destructible_v<pinned_buffer>);
static_assert(std::is_nothrow_destructible_v<cufile_registration>);
static_assert(std::is_nothrow_destructible_v<gpu::cuda_stream>);
static_assert(std::is_nothrow_destructible_v<gpu::cuda_event>);
static_assert(std::is_nothrow_destructible_v<gpu::context_guard>);
static_assert(std::is_nothrow_move_constructible_v<gpu::cuda_stream> && std::is_nothrow_move_assignable_v<gpu::cuda_stream>);
static_assert(std::is_nothrow_move_constructible_v<gpu::cuda_event> && std::is_nothrow_move_assignable_v<gpu::cuda_event>);
static_assert(!std::is_copy_constructible_v<gpu::cuda_stream> && !std::is_copy_constructible_v<gpu::cuda_event>);
static_assert(!std::is_move_constructible_v<gpu::context_guard>, "a context guard belongs to one scope");

// Empty and moved-from owners hold nothing and destroy as no-ops (they never reach the driver, so this runs
// with no GPU; tests/gpu/paths_test.cpp moves owners of real resources).
TEST(gpu_resources, empty_and_moved_from_owners_are_default_constructed) {
  gpu::cuda_stream s;
  gpu::cuda_stream s2(std::move(s));
  EXPECT_FALSE(s);
  EXPECT_FALSE(s2);
  EXPECT_EQ(s.get(), nullptr);
  EXPECT_EQ(s.device(), -1);
  s = std::move(s2);
  s.reset();
  EXPECT_FALSE(s);
  gpu::cuda_event e;
  gpu::cuda_event e2;
  e2 = std::move(e);
  EXPECT_FALSE(e);
  EXPECT_EQ(e2.get(), nullptr);
  EXPECT_EQ(e2.device(), -1);
  device_buffer d;
  device_buffer d2(std::move(d));
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.device(), -1);
  d = std::move(d2);
  EXPECT_EQ(d.data(), nullptr);
  pinned_buffer p;
  pinned_buffer p2(std::move(p));
  p = std::move(p2);
  EXPECT_EQ(p.data(), nullptr);
  EXPECT_EQ(p.size(), 0u);
  cufile_registration r;
  cufile_registration r2(std::move(r));
  EXPECT_FALSE(r.active());
  EXPECT_FALSE(r2.active());
}

// Without a usable driver every owner and the context guard fail with one clean error (ENODEV), and
// nothing is left to free.
TEST(gpu_resources, without_a_driver_construction_is_a_clean_error) {
  std::string reason;
  if (gpu_available(&reason)) GTEST_SKIP() << "a GPU is usable here: tests/gpu covers this machine";
  auto enodev = [](auto&& make) {
    try {
      make();
    } catch (const error& e) {
      return e.code() == std::errc::no_such_device;
    }
    return false;
  };
  EXPECT_TRUE(enodev([] { gpu::context_guard g(0); })) << reason;
  EXPECT_TRUE(enodev([] { gpu::cuda_stream s(0, 0); }));
  EXPECT_TRUE(enodev([] { gpu::cuda_event e(0, 0); }));
  EXPECT_TRUE(enodev([] { device_buffer b(4096); }));
  EXPECT_TRUE(enodev([] { pinned_buffer b(4096); }));
  unsigned char host[16] = {};
  device_buffer none;
  buffer_view dev{host, sizeof host, memory_kind::device, 0};
  EXPECT_TRUE(enodev([&] { copy_into(dev, 0, host, 8); }));
}

}  // namespace
}  // namespace gdskit
