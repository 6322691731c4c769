// Device memory capacity and exact accounting of the CPU backend.
#include <gtest/gtest.h>

#include <string>

#include "core/cpu/cpu_device.h"
#include "base/error.h"
#include "core/tensor.h"

namespace {

TEST(MemoryBudget, AllocationsUpToCapacitySucceedOneByteOverFails) {
  stp::CpuDeviceOptions o;
  o.capacity = 1000;
  stp::CpuDevice dev(3, o);
  void* a = dev.allocate(600);
  void* b = dev.allocate(400);  // exactly at capacity
  EXPECT_EQ(dev.memory_stats().in_use, 1000u);
  try {
    dev.allocate(1);
    FAIL() << "allocation beyond capacity succeeded";
  } catch (const stp::OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 1u);
    EXPECT_EQ(std::string(e.what()),
              "cpu:3: out of device memory: requested 1 B, in use 1000 B, capacity 1000 B, peak 1000 B");
  }
  dev.deallocate(a);
  dev.deallocate(b);
}

TEST(MemoryBudget, PeakAndCountsAreExact) {
  stp::CpuDeviceOptions o;
  o.capacity = 1 << 20;
  stp::CpuDevice dev(0, o);
  void* a = dev.allocate(100);
  void* b = dev.allocate(250);
  dev.deallocate(a);
  void* c = dev.allocate(50);
  auto s = dev.memory_stats();
  EXPECT_EQ(s.in_use, 300u);
  EXPECT_EQ(s.peak, 350u);
  EXPECT_EQ(s.alloc_count, 3u);
  EXPECT_EQ(s.free_count, 1u);
  dev.reset_peak();
  EXPECT_EQ(dev.memory_stats().peak, 300u);
  dev.deallocate(b);
  dev.deallocate(c);
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
}

TEST(MemoryBudget, TensorsReleaseTheirStorage) {
  stp::CpuDeviceOptions o;
  o.capacity = 4096;
  stp::CpuDevice dev(0, o);
  stp::DeviceAllocator alloc(dev);
  {
    auto t = stp::Tensor::empty(alloc, {16, 32});  // 2048 bytes
    auto v = t.view(32, {8, 32});                  // shares storage
    EXPECT_EQ(dev.memory_stats().in_use, 2048u);
    EXPECT_EQ(v.f32(), t.f32() + 32);
    EXPECT_THROW(stp::Tensor::empty(alloc, {16, 33}), stp::OutOfMemoryError);
  }
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
  EXPECT_EQ(dev.memory_stats().peak, 2048u);
}

TEST(MemoryBudget, PinnedHostIsCountedSeparately) {
  stp::CpuDeviceOptions o;
  o.capacity = 100;
  stp::CpuDevice dev(0, o);
  void* h = dev.allocate_pinned_host(1000);  // not limited by the device capacity
  EXPECT_TRUE(dev.is_pinned_host(static_cast<char*>(h) + 999));
  EXPECT_FALSE(dev.is_pinned_host(static_cast<char*>(h) + 1000));
  EXPECT_EQ(dev.pinned_host_stats().in_use, 1000u);
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
  dev.deallocate_pinned_host(h);
}

TEST(MemoryBudget, FreeOfForeignPointerIsAnInternalError) {
  stp::CpuDevice dev(0, {});
  int x = 0;
  EXPECT_THROW(dev.deallocate(&x), stp::InternalError);
}

}  // namespace
