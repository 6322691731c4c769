// BlockArena (memory/block_arena.h) on the CPU backend: best fit, the other placements, split/coalesce,
// the exact budget and its OOM report, the tail as last resort (a capacity-independent layout under
// every placement), flat segments in steady state, release_cached, categories.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "base/error.h"
#include "memory/block_arena.h"

namespace {

using stp::ArenaOptions;
using stp::BlockArena;
using stp::MemoryCategory;
using Block = std::shared_ptr<stp::Storage>;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

char* at(const Block& b) { return static_cast<char*>(b->data); }

std::size_t live(const stp::ArenaStats& s, MemoryCategory c) { return s.by_category[static_cast<std::size_t>(c)]; }
std::size_t peak(const stp::ArenaStats& s, MemoryCategory c) { return s.peak_by_category[static_cast<std::size_t>(c)]; }

struct ArenaTest : ::testing::Test {
  stp::CpuDevice dev{0, {}};
  std::unique_ptr<stp::Stream> home = dev.create_stream("home");

  // A fixed pool: one segment of `bytes`, carved by the arena and never grown.
  std::unique_ptr<BlockArena> fixed(std::size_t bytes, stp::BlockPlacement placement = stp::BlockPlacement::BestFit) {
    ArenaOptions o = stp::device_arena_options(dev);
    o.grow = false;
    o.placement = placement;
    auto arena = std::make_unique<BlockArena>(dev, *home, std::move(o));
    arena->reserve(bytes);
    return arena;
  }
  std::unique_ptr<BlockArena> growing(std::size_t budget, std::size_t segment_bytes) {
    ArenaOptions o = stp::device_arena_options(dev, budget);
    o.segment_bytes = segment_bytes;
    return std::make_unique<BlockArena>(dev, *home, std::move(o));
  }
};

TEST_F(ArenaTest, BestFitChoosesTheSmallestFittingBlock) {
  auto arena = fixed(1 * MiB);
  // Holes of 4, 2 and 8 KiB kept apart by live separators, then the large tail.
  Block a = arena->allocate(4 * KiB), s1 = arena->allocate(256);
  Block b = arena->allocate(2 * KiB), s2 = arena->allocate(256);
  Block c = arena->allocate(8 * KiB), s3 = arena->allocate(256);
  char *hole4 = at(a), *hole2 = at(b), *hole8 = at(c);
  a.reset();
  b.reset();
  c.reset();
  Block r2 = arena->allocate(2 * KiB);
  EXPECT_EQ(at(r2), hole2);  // exact fit, although the 4 KiB hole comes first
  Block r3 = arena->allocate(3 * KiB);
  EXPECT_EQ(at(r3), hole4);  // 4 KiB is the smallest hole that fits 3 KiB
  Block r5 = arena->allocate(5 * KiB);
  EXPECT_EQ(at(r5), hole8);  // only the 8 KiB hole and the tail fit 5 KiB
  // Split remainders are holes too: 1 KiB after r3, 3 KiB after r5.
  Block r1 = arena->allocate(1 * KiB);
  EXPECT_EQ(at(r1), hole4 + 3 * KiB);
  Block r2b = arena->allocate(2 * KiB + 1);  // 2.25 KiB aligned: the 3 KiB rest, not the tail
  EXPECT_EQ(at(r2b), hole8 + 5 * KiB);
  EXPECT_EQ(arena->stats().segment_allocs, 1u);
}

// The segment's untouched tail is taken only when no other free block fits, even when it is the
// smallest block that does.
TEST_F(ArenaTest, TheTailIsTheLastResort) {
  auto arena = fixed(24 * KiB);
  Block a = arena->allocate(8 * KiB), s1 = arena->allocate(256);
  Block t = arena->allocate(8 * KiB);  // the tail is now 24 KiB - 16.25 KiB = 7.75 KiB
  char* hole8 = at(a);
  a.reset();
  Block r = arena->allocate(3 * KiB);
  EXPECT_EQ(at(r), hole8);  // plain best fit would take the 7.75 KiB tail
  Block r2 = arena->allocate(6 * KiB);
  EXPECT_EQ(at(r2), at(t) + 8 * KiB) << "the hole's 5 KiB rest is too small: the tail";
}

// StatesLow: every category but activations by first fit (lowest address), activations by best fit.
TEST_F(ArenaTest, StatesLowPacksModelStatesFirstFitAndActivationsBestFit) {
  auto arena = fixed(1 * MiB, stp::BlockPlacement::StatesLow);
  // Holes of 4 and 2 KiB kept apart by live separators, then the large tail.
  Block a = arena->allocate(4 * KiB), s1 = arena->allocate(256);
  Block b = arena->allocate(2 * KiB), s2 = arena->allocate(256);
  char *hole4 = at(a), *hole2 = at(b);
  a.reset();
  b.reset();
  Block act = arena->allocate(2 * KiB);  // activations (the default category): best fit
  EXPECT_EQ(at(act), hole2);
  act.reset();
  {
    BlockArena::CategoryScope w(*arena, MemoryCategory::Weights);
    Block weight = arena->allocate(2 * KiB);  // the lowest-address block that fits
    EXPECT_EQ(at(weight), hole4);
  }
  {
    BlockArena::CategoryScope g(*arena, MemoryCategory::Gradients);
    Block grad = arena->allocate(2 * KiB);
    EXPECT_EQ(at(grad), hole4);
  }
}

// One trace of allocations and frees (sizes, lifetimes and categories from a fixed seed) replayed
// in one-segment arenas of different capacities, under every placement: every block gets the same
// offset in every arena that holds the trace, and the trace fails exactly in the arenas smaller
// than its high_water. This is what lets the planner read a plan's minimum budget off one dry run.
class ArenaLayout : public ArenaTest, public ::testing::WithParamInterface<stp::BlockPlacement> {};

INSTANTIATE_TEST_SUITE_P(EveryPlacement, ArenaLayout,
                         ::testing::Values(stp::BlockPlacement::BestFit, stp::BlockPlacement::FirstFit,
                                           stp::BlockPlacement::StatesLow, stp::BlockPlacement::SmallLow),
                         [](const auto& p) {
                           std::string name = stp::to_string(p.param);
                           name.erase(name.find('-'), 1);
                           return name;
                         });

TEST_P(ArenaLayout, DoesNotDependOnTheCapacity) {
  struct Event {
    bool alloc;
    std::size_t bytes_or_slot;
    MemoryCategory category = MemoryCategory::Activations;
  };
  std::vector<Event> trace;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {  // xorshift64
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  std::size_t slots = 0, live = 0;
  std::vector<std::size_t> open;
  for (int i = 0; i < 600; ++i) {
    if (open.empty() || (next() % 100 < 55 && live < 40)) {
      const std::size_t bytes = 256 * (1 + next() % 512) + next() % 256;  // to 128 KiB: small and large
      trace.push_back({true, bytes, next() % 3 ? MemoryCategory::Activations : MemoryCategory::Weights});
      open.push_back(slots++);
      ++live;
    } else {
      std::size_t k = next() % open.size();
      trace.push_back({false, open[k]});
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      --live;
    }
  }
  // Replays the trace; returns each allocation's offset from the arena's first block, or an empty
  // vector when the arena ran out.
  auto replay = [&](std::size_t capacity, std::size_t* high_water) {
    auto arena = fixed(capacity, GetParam());
    std::vector<Block> blocks(slots);
    std::vector<std::ptrdiff_t> offsets;
    char* base = nullptr;
    std::size_t slot = 0;
    try {
      for (const Event& e : trace) {
        if (!e.alloc) {
          blocks[e.bytes_or_slot].reset();
          continue;
        }
        BlockArena::CategoryScope as(*arena, e.category);
        blocks[slot] = arena->allocate(e.bytes_or_slot);
        if (!base) base = at(blocks[slot]);
        offsets.push_back(at(blocks[slot]) - base);
        ++slot;
      }
    } catch (const stp::OutOfMemoryError&) {
      return std::vector<std::ptrdiff_t>{};
    }
    if (high_water) *high_water = arena->stats().high_water;
    return offsets;
  };
  std::size_t high_water = 0;
  const std::vector<std::ptrdiff_t> roomy = replay(64 * MiB, &high_water);
  ASSERT_FALSE(roomy.empty());
  ASSERT_GT(high_water, 0u);
  for (std::size_t capacity : {high_water, high_water + 1, high_water + 255, high_water + 4 * KiB + 17,
                               high_water + 100 * KiB, 2 * high_water}) {
    EXPECT_EQ(replay(capacity, nullptr), roomy) << "capacity " << capacity << ", high_water " << high_water;
  }
  EXPECT_TRUE(replay(high_water - 256, nullptr).empty()) << "below high_water the trace cannot place";
}

TEST_F(ArenaTest, SplitAndCoalesceRestoreOneFreeBlock) {
  auto arena = fixed(64 * KiB);
  char* base = nullptr;
  {
    Block x = arena->allocate(1000), y = arena->allocate(3000), z = arena->allocate(5000);
    base = at(x);
    EXPECT_EQ(at(y), base + 1024);  // 256-byte aligned sizes, carved in address order
    EXPECT_EQ(at(z), base + 1024 + 3072);
    EXPECT_EQ(arena->stats().largest_free, 64 * KiB - 1024 - 3072 - 5120);
    y.reset();  // a hole between two live blocks: nothing to merge with
    EXPECT_EQ(arena->stats().largest_free, 64 * KiB - 1024 - 3072 - 5120);
    x.reset();  // merges with the hole after it
    EXPECT_EQ(arena->stats().largest_free, 64 * KiB - 1024 - 3072 - 5120);
    Block w = arena->allocate(4096);  // fits exactly into the merged x+y hole
    EXPECT_EQ(at(w), base);
  }  // w and z go: both merge back
  auto s = arena->stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.largest_free, 64 * KiB);
  EXPECT_EQ(at(arena->allocate(64 * KiB)), base);  // one block again: the whole segment
  EXPECT_EQ(arena->stats().segment_allocs, 1u);
}

TEST_F(ArenaTest, ExactBudgetThenOneByteMoreFailsWithAReport) {
  auto arena = growing(1 * MiB, 32 * MiB);  // segment_bytes > budget: segments fit the request
  Block w, g;
  {
    BlockArena::CategoryScope scope(*arena, MemoryCategory::Weights);
    w = arena->allocate(600 * KiB);
  }
  {
    BlockArena::CategoryScope scope(*arena, MemoryCategory::Gradients);
    g = arena->allocate(424 * KiB);  // 600 + 424 = 1024 KiB: exactly the budget
  }
  auto s = arena->stats();
  EXPECT_EQ(s.reserved, 1 * MiB);
  EXPECT_EQ(s.allocated, 1 * MiB);
  EXPECT_EQ(dev.memory_stats().in_use, 1 * MiB);
  try {
    arena->allocate(1);
    FAIL() << "an allocation beyond the budget succeeded";
  } catch (const stp::OutOfMemoryError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.requested(), 1u);
    EXPECT_NE(m.find("memory.device_budget = " + stp::format_bytes(1 * MiB)), std::string::npos) << m;
    EXPECT_NE(m.find("weights " + stp::format_bytes(600 * KiB)), std::string::npos) << m;
    EXPECT_NE(m.find("gradients " + stp::format_bytes(424 * KiB)), std::string::npos) << m;
    EXPECT_NE(m.find("activations " + stp::format_bytes(0)), std::string::npos) << m;
  }
  EXPECT_EQ(arena->stats().reserved, 1 * MiB);  // the failed request took nothing
  // Freed bytes are reusable up to the budget again, with segments given back to make room.
  w.reset();
  Block big = arena->allocate(600 * KiB);
  EXPECT_EQ(arena->stats().segment_allocs, 2u);  // served from the cached 600 KiB segment
  big.reset();
  g.reset();
  Block all = arena->allocate(1 * MiB);  // needs both segments returned and one new segment
  auto t = arena->stats();
  EXPECT_EQ(t.reserved, 1 * MiB);
  EXPECT_EQ(t.segment_frees, 2u);
  EXPECT_EQ(t.segment_allocs, 3u);
}

TEST_F(ArenaTest, SegmentsStayFlatInSteadyState) {
  auto arena = growing(SIZE_MAX, 1 * MiB);
  const std::vector<std::size_t> sizes = {300 * KiB, 1000, 700 * KiB, 2 * MiB + 5, 64 * KiB, 123457, 900 * KiB};
  auto round = [&] {
    std::vector<Block> kept;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Block b = arena->allocate(sizes[i]);
      if (i % 2 == 0) kept.push_back(std::move(b));  // odd ones die at once: holes in between
    }
  };
  round();
  const auto first = arena->stats();
  const auto device_allocs = dev.memory_stats().alloc_count;
  EXPECT_GE(first.segment_allocs, 2u);
  for (int i = 0; i < 9; ++i) round();
  const auto s = arena->stats();
  EXPECT_EQ(s.segment_allocs, first.segment_allocs);
  EXPECT_EQ(s.segment_frees, 0u);
  EXPECT_EQ(s.reserved, first.reserved);
  EXPECT_EQ(s.peak_reserved, first.peak_reserved);
  EXPECT_EQ(dev.memory_stats().alloc_count, device_allocs);
  EXPECT_EQ(s.alloc_count, 10 * sizes.size());
  EXPECT_EQ(s.free_count, s.alloc_count);
  EXPECT_EQ(s.allocated, 0u);
}

TEST_F(ArenaTest, ReleaseCachedGivesFreeSegmentsBack) {
  auto arena = growing(SIZE_MAX, 1 * MiB);
  Block keep = arena->allocate(512 * KiB);  // segment 1 (1 MiB), stays partly live
  Block drop = arena->allocate(3 * MiB);    // segment 2, its own size
  EXPECT_EQ(dev.memory_stats().in_use, 4 * MiB);
  drop.reset();
  EXPECT_EQ(dev.memory_stats().in_use, 4 * MiB);  // cached, not returned
  arena->release_cached();
  auto s = arena->stats();
  EXPECT_EQ(s.segment_frees, 1u);
  EXPECT_EQ(s.reserved, 1 * MiB);
  EXPECT_EQ(dev.memory_stats().in_use, 1 * MiB);
  keep.reset();
  arena->release_cached();
  EXPECT_EQ(arena->stats().reserved, 0u);
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
}

TEST_F(ArenaTest, CategoryAccountingAndPeakByCategory) {
  auto arena = growing(SIZE_MAX, 1 * MiB);
  EXPECT_EQ(arena->category(), MemoryCategory::Activations);
  Block w, g, a;
  {
    BlockArena::CategoryScope ws(*arena, MemoryCategory::Weights);
    w = arena->allocate(1 * KiB);
    {
      BlockArena::CategoryScope gs(*arena, MemoryCategory::Gradients);
      g = arena->allocate(2 * KiB);
    }
    EXPECT_EQ(arena->category(), MemoryCategory::Weights);  // scopes nest
  }
  a = arena->allocate(4 * KiB);  // default category
  a.reset();
  Block buf;
  {
    BlockArena::CategoryScope bs(*arena, MemoryCategory::Buffers);
    buf = arena->allocate(3 * KiB);  // below the peak of 7 KiB: the peak snapshot stays
  }
  auto s = arena->stats();
  EXPECT_EQ(live(s, MemoryCategory::Weights), 1 * KiB);
  EXPECT_EQ(live(s, MemoryCategory::Gradients), 2 * KiB);
  EXPECT_EQ(live(s, MemoryCategory::Activations), 0u);
  EXPECT_EQ(live(s, MemoryCategory::Buffers), 3 * KiB);
  EXPECT_EQ(s.allocated, 6 * KiB);
  EXPECT_EQ(s.peak_allocated, 7 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Weights), 1 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Gradients), 2 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Activations), 4 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Buffers), 0u);
  arena->reset_peak();
  s = arena->stats();
  EXPECT_EQ(s.peak_allocated, 6 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Buffers), 3 * KiB);
  EXPECT_EQ(peak(s, MemoryCategory::Activations), 0u);
  EXPECT_STREQ(stp::to_string(MemoryCategory::OptimizerState), "optimizer_state");
}

}  // namespace
