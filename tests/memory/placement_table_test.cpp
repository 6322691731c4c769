// The planned placement (memory/placement_table.h, BlockPlacement::Planned in memory/block_arena.h)
// on the CPU backend: a steady-state run (a setup, then steps that repeat one sequence of
// allocations and frees, some blocks living into the next step) traced by an arena, laid out
// offline, and replayed at the table's offsets:
//   * every allocation of every step lands at its table's offset, past the traced steps too (the
//     period repeats), with no miss, in every capacity at or above the table's high water, and the
//     run fails below it;
//   * no two blocks alive at once share a byte (the arena would not have placed them otherwise);
//   * an allocation the table does not foresee is placed by best fit and counted;
//   * a trace whose third step differs from its second has no table.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/error.h"
#include "core/cpu/cpu_device.h"
#include "memory/block_arena.h"
#include "memory/placement_table.h"

namespace {

using stp::AllocationTrace;
using stp::ArenaOptions;
using stp::BlockArena;
using stp::PlacementTable;
using stp::StepMark;
using Block = std::shared_ptr<stp::Storage>;

constexpr std::size_t MiB = 1024 * 1024;

// One step's program: allocate block `id` of `bytes`, free block `id` of this step, or free block
// `id` of the previous step (nothing in the first step). One block allocated late in the step lives
// into the next one, until the next step's 20th op (before that step allocates it again).
struct Op {
  enum Kind { Alloc, Free, FreePrevious } kind;
  int id;
  std::size_t bytes = 0;
};

std::vector<Op> step_program() {
  std::vector<Op> ops;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {  // xorshift64
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  std::vector<int> open;
  int ids = 0, crossing = -1;
  for (int i = 0; i < 300; ++i) {
    if (i == 20) ops.push_back({Op::FreePrevious, -1});  // the previous step's crossing block
    if (open.empty() || (next() % 100 < 55 && open.size() < 30)) {
      const std::size_t bytes = 256 * (1 + next() % 512) + next() % 256;
      ops.push_back({Op::Alloc, ids, bytes});
      if (i >= 250 && crossing < 0) crossing = ids;  // freed by the next step
      else open.push_back(ids);
      ++ids;
    } else {
      const std::size_t k = next() % open.size();
      ops.push_back({Op::Free, open[k]});
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (int id : open) ops.push_back({Op::Free, id});
  for (Op& op : ops)
    if (op.kind == Op::FreePrevious) op.id = crossing;
  return ops;
}

struct Traced {
  std::vector<std::ptrdiff_t> offsets;  // of every allocation from the segment's base
  std::vector<StepMark> marks;          // before each step, and after the last
  stp::ArenaStats stats;
  AllocationTrace trace;
  bool out_of_memory = false;
  std::string oom_message;  // what the OutOfMemoryError said
};

struct PlannedPlacement : ::testing::Test {
  stp::CpuDevice dev{0, {}};
  std::unique_ptr<stp::Stream> home = dev.create_stream("home");
  const std::vector<Op> program = step_program();

  // A setup of three long-lived blocks, then `steps` steps of the program in a one-segment arena of
  // `capacity`; `odd` (when >= 0): that allocation of the run takes 256 bytes more; `between`:
  // before every step after the first, a block of that many bytes is allocated and freed (what a
  // checkpoint save does between steps).
  Traced run(std::size_t capacity, int steps, stp::BlockPlacement placement,
             std::shared_ptr<const PlacementTable> table = nullptr, long odd = -1, std::size_t between = 0) {
    ArenaOptions o = stp::device_arena_options(dev);
    o.grow = false;
    o.placement = placement;
    o.table = std::move(table);
    o.record_allocations = true;
    BlockArena arena(dev, *home, std::move(o));
    arena.reserve(capacity);
    Traced out;
    std::vector<Block> setup, previous, current;
    char* base = nullptr;
    long ordinal = 0;
    auto allocate = [&](std::size_t bytes) {
      Block b = arena.allocate(bytes + (ordinal++ == odd ? 256 : 0));
      if (!base) base = static_cast<char*>(b->data);
      out.offsets.push_back(static_cast<char*>(b->data) - base);
      return b;
    };
    auto mark = [&] {
      const stp::ArenaStats s = arena.stats();
      out.marks.push_back({s.alloc_count, s.alloc_count + s.free_count});
    };
    try {
      for (std::size_t bytes : {300000u, 4096u, 70000u}) setup.push_back(allocate(bytes));
      for (int step = 0; step < steps; ++step) {
        if (step > 0 && between > 0) arena.allocate(between).reset();
        mark();
        arena.begin_step();
        current.assign(program.size(), nullptr);
        for (const Op& op : program) {
          if (op.kind == Op::Alloc) current[static_cast<std::size_t>(op.id)] = allocate(op.bytes);
          if (op.kind == Op::Free) current[static_cast<std::size_t>(op.id)].reset();
          if (op.kind == Op::FreePrevious && !previous.empty()) previous[static_cast<std::size_t>(op.id)].reset();
        }
        previous = std::move(current);
      }
      mark();
    } catch (const stp::OutOfMemoryError& e) {
      out.out_of_memory = true;
      out.oom_message = e.what();
    }
    out.stats = arena.stats();
    out.trace = arena.allocation_trace();
    return out;
  }

  PlacementTable table_of(const Traced& traced) {
    std::optional<PlacementTable> t = stp::plan_placement(traced.trace, traced.marks, traced.marks.back().events);
    if (!t) throw stp::Error("the traced run has no table");
    return *t;
  }
};

TEST_F(PlannedPlacement, EveryAllocationLandsAtItsOffsetPastTheTracedStepsAndFailsBelowTheHighWater) {
  const Traced traced = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  ASSERT_FALSE(traced.out_of_memory);
  ASSERT_EQ(traced.marks.size(), 4u);
  auto table = std::make_shared<const PlacementTable>(table_of(traced));
  EXPECT_EQ(table->period(), traced.marks[2].allocations - traced.marks[1].allocations);
  EXPECT_EQ(table->entries(), traced.marks[2].allocations);  // setup, step 1 and one period
  const std::size_t high = table->high_water();
  EXPECT_GE(high, traced.stats.peak_allocated);
  for (std::size_t capacity : {high, high + 256, high + 4096, 2 * high}) {
    SCOPED_TRACE(capacity);
    const Traced planned = run(capacity, 6, stp::BlockPlacement::Planned, table);
    ASSERT_FALSE(planned.out_of_memory);
    EXPECT_EQ(planned.stats.placement_misses, 0u);
    EXPECT_EQ(planned.stats.high_water, high);
    EXPECT_EQ(planned.stats.peak_allocated, traced.stats.peak_allocated);  // placement moves no live byte
    ASSERT_EQ(planned.offsets.size(), traced.marks[0].allocations + 6 * table->period());
    for (std::size_t k = 0; k < planned.offsets.size(); ++k)
      ASSERT_EQ(planned.offsets[k], static_cast<std::ptrdiff_t>(table->at(k).offset)) << "allocation " << k;
  }
  EXPECT_TRUE(run(high - 256, 6, stp::BlockPlacement::Planned, table).out_of_memory);
}

TEST_F(PlannedPlacement, LaysOutNoHigherThanBestFitOnThisRun) {
  const Traced traced = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  const PlacementTable table = table_of(traced);
  const Traced best_fit = run(64 * MiB, 6, stp::BlockPlacement::BestFit);
  EXPECT_LE(table.high_water(), best_fit.stats.high_water);
}

TEST_F(PlannedPlacement, AnAllocationTheTableDoesNotForeseeIsPlacedByBestFitAndCounted) {
  const Traced traced = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  auto table = std::make_shared<const PlacementTable>(table_of(traced));
  const long odd = static_cast<long>(traced.marks[1].allocations) + 5;  // in the second step
  const Traced planned = run(64 * MiB, 4, stp::BlockPlacement::Planned, table, odd);
  ASSERT_FALSE(planned.out_of_memory);
  EXPECT_GE(planned.stats.placement_misses, 1u);
  EXPECT_NE(planned.offsets[static_cast<std::size_t>(odd)],
            static_cast<std::ptrdiff_t>(table->at(static_cast<std::uint64_t>(odd)).offset));
}

// A run that leaves its table (here the setup's first block is larger than traced, so best fit
// places it and the table's later offsets collide) and then runs out of its budget says why.
TEST_F(PlannedPlacement, AnOutOfMemoryAfterMissesSaysTheRunLeftItsTable) {
  const Traced traced = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  auto table = std::make_shared<const PlacementTable>(table_of(traced));
  const Traced planned = run(table->high_water(), 4, stp::BlockPlacement::Planned, table, 0);
  ASSERT_TRUE(planned.out_of_memory);
  EXPECT_GE(planned.stats.placement_misses, 1u);
  EXPECT_NE(planned.oom_message.find("not where the planned block placement put them"), std::string::npos)
      << planned.oom_message;
  const Traced online = run(1 * MiB, 1, stp::BlockPlacement::BestFit, nullptr, -1, 0);
  ASSERT_TRUE(online.out_of_memory);
  EXPECT_EQ(online.oom_message.find("planned block placement"), std::string::npos) << online.oom_message;
}

TEST_F(PlannedPlacement, AllocationsBetweenStepsDoNotShiftTheSteps) {
  const Traced traced = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  auto table = std::make_shared<const PlacementTable>(table_of(traced));
  const Traced planned = run(64 * MiB, 5, stp::BlockPlacement::Planned, table, -1, 1000);
  ASSERT_FALSE(planned.out_of_memory);
  EXPECT_EQ(planned.stats.placement_misses, 4u);  // the four blocks between steps, nothing else
  EXPECT_EQ(planned.stats.high_water, table->high_water());
}

TEST_F(PlannedPlacement, ATraceWhoseThirdStepDiffersHasNoTable) {
  const Traced steady = run(64 * MiB, 3, stp::BlockPlacement::BestFit);
  ASSERT_TRUE(stp::plan_placement(steady.trace, steady.marks, steady.marks.back().events).has_value());
  const long odd = static_cast<long>(steady.marks[2].allocations) + 7;  // in the third step
  const Traced changed = run(64 * MiB, 3, stp::BlockPlacement::BestFit, nullptr, odd);
  EXPECT_FALSE(stp::plan_placement(changed.trace, changed.marks, changed.marks.back().events).has_value());
}

TEST_F(PlannedPlacement, TheTraceRecordsLifetimesOnTheEventClock) {
  ArenaOptions o = stp::device_arena_options(dev);
  o.record_allocations = true;
  BlockArena arena(dev, *home, std::move(o));
  Block a = arena.allocate(100);
  Block b = arena.allocate(1000);
  a.reset();
  const AllocationTrace t = arena.allocation_trace();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0], (stp::AllocationRecord{256, 0, 2}));
  EXPECT_EQ(t[1], (stp::AllocationRecord{1024, 1, stp::AllocationRecord::kAlive}));
}

}  // namespace
