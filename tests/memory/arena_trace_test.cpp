// BlockArena::set_trace (memory/block_arena.h): every allocation and free adds a "device memory"
// counter sample with the live bytes by category, stamped in the home stream's order; the largest
// total equals stats().peak_allocated; detaching (or destroying the arena) stops the samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "core/cpu/cpu_device.h"
#include "base/trace.h"
#include "memory/block_arena.h"

namespace {

using stp::BlockArena;
using stp::MemoryCategory;

double total(const stp::TraceCounter& c) {
  double t = 0;
  for (const auto& [name, v] : c.series) t += v;
  return t;
}

double series(const stp::TraceCounter& c, const std::string& name) {
  for (const auto& [n, v] : c.series)
    if (n == name) return v;
  return -1;
}

TEST(ArenaTrace, CountersFollowEveryAllocationAndFreeAndPeakAtPeakAllocated) {
  stp::CpuDevice dev{0, {}};
  auto home = dev.create_stream("compute");
  stp::TraceRecorder rec;
  auto arena = std::make_unique<BlockArena>(dev, *home, stp::device_arena_options(dev));
  arena->set_trace(&rec, 3);
  std::shared_ptr<stp::Storage> w, a, b;
  {
    BlockArena::CategoryScope scope(*arena, MemoryCategory::Weights);
    w = arena->allocate(1024);
  }
  a = arena->allocate(4096);  // activations (default category)
  b = arena->allocate(512);
  a.reset();
  home->synchronize();  // samples are stamped when the home stream reaches them
  auto samples = rec.counters();
  ASSERT_EQ(samples.size(), 4u);  // three allocations, one free
  for (const auto& c : samples) {
    EXPECT_EQ(c.pid, 3);
    EXPECT_EQ(c.name, "device memory");
    EXPECT_EQ(c.series.size(), stp::kMemoryCategories);
  }
  for (std::size_t i = 1; i < samples.size(); ++i) EXPECT_GE(samples[i].ts_us, samples[i - 1].ts_us);
  EXPECT_EQ(series(samples[0], "weights"), 1024);
  EXPECT_EQ(series(samples[1], "activations"), 4096);
  EXPECT_EQ(series(samples[2], "activations"), 4096 + 512);
  EXPECT_EQ(series(samples[3], "activations"), 512);
  double peak = 0;
  for (const auto& c : samples) peak = std::max(peak, total(c));
  EXPECT_EQ(peak, static_cast<double>(arena->stats().peak_allocated));

  arena->set_trace(nullptr, 3);
  b.reset();
  auto c = arena->allocate(256);
  home->synchronize();
  EXPECT_EQ(rec.counters().size(), 4u);  // detached: nothing more

  arena->set_trace(&rec, 3);
  arena.reset();  // the storage outlives the arena: its free must not sample (or touch the stream)
  c.reset();
  home->synchronize();
  EXPECT_EQ(rec.counters().size(), 4u);
}

}  // namespace
