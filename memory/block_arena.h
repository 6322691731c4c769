// BlockArena: the one allocator behind stp's memory budget, used for device memory (the caching
// device allocator) and for the pinned host pool (memory/pinned_pool.h).
//
//   * Segments: memory is taken from the backend in segments (Device::allocate or pinned host
//     memory) and carved by the arena's placement (BlockPlacement: best fit by default, or first
//     fit, or first fit for one class of blocks and best fit for the rest, or a table computed
//     offline from a dry run's trace: memory/placement_table.h), splitting blocks and
//     coalescing neighbours — exact fit up to a 256-byte alignment, never power-of-two rounding.
//     Under every placement a segment's untouched tail (the free block that ends it) is chosen
//     only when no other free block fits, so a one-segment arena (a device budget) lays blocks
//     out the same whatever its capacity: a run places in any budget at or above its high_water
//     under that placement, and in none below. A planned placement (BlockPlacement::Planned) puts
//     each allocation at its table's offset whatever the capacity, and an allocation whose offset
//     lies beyond the segment is out of memory, so the same holds for it; an allocation the table
//     does not foresee (another size, or bytes not free) is placed by best fit and counted
//     (ArenaStats::placement_misses). Placement moves no allocation or free, only the
//     addresses: the live bytes and their peaks are the same under every placement. Segments are
//     kept (cached) and reused; they go back to the backend only when a new segment would break
//     the budget.
//   * Budget: reserved bytes (all segments) never exceed `budget`. An allocation that cannot be
//     served throws OutOfMemoryError with a report: the budget and its knob, what is live by
//     category (weights, gradients, optimizer state, activations, buffers), and what to change.
//   * Stream-ordered reuse: a freed block carries one event per stream that used it
//     (Storage::record_use, plus the stream it was allocated for). Whoever reuses any of its
//     bytes on stream t makes t wait for the events of the *other* streams (a stream wait, never
//     a host wait); a segment goes back to the backend only after a host wait on its events.
//   * Determinism: allocation and free happen in host program order (a block is free as soon as
//     its last reference drops, whatever the streams are doing), so the statistics of a run are
//     the same every time — which is what lets the planner predict peaks exactly (memory/plan.h).
//
// Thread-safe (one mutex, never held while waiting on the host); in practice each arena serves
// one rank's host thread. On CUDA a storage must not be released inside a host callback
// (releasing records an event, which CUDA forbids there) — stp never captures storages in them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/trace_names.h"
#include "core/device.h"
#include "core/tensor.h"
#include "memory/placement_table.h"

namespace stp {

enum class MemoryCategory : std::uint8_t { Weights, Gradients, OptimizerState, Activations, Buffers };
constexpr std::size_t kMemoryCategories = 5;
const char* to_string(MemoryCategory c);  // trace::kMemorySeries (base/trace_names.h): "weights", ...

struct ArenaStats {
  std::size_t budget = 0;          // reserved never exceeds this
  std::size_t allocated = 0;       // bytes in live blocks (aligned sizes)
  std::size_t peak_allocated = 0;  // high-water mark of `allocated`
  std::size_t reserved = 0;        // bytes in segments (allocated + cached free)
  std::size_t peak_reserved = 0;
  std::size_t largest_free = 0;                              // largest free block (fragmentation indicator)
  std::size_t high_water = 0;                                // furthest end of a live block from its segment's base
  std::array<std::size_t, kMemoryCategories> by_category{};  // live bytes now
  std::array<std::size_t, kMemoryCategories> peak_by_category{};  // at the moment of peak_allocated
  std::uint64_t alloc_count = 0, free_count = 0;
  std::uint64_t segment_allocs = 0, segment_frees = 0;  // backend calls (flat in steady state)
  std::uint64_t stream_waits = 0;                       // reuses that had to order a stream after another one
  // BlockPlacement::Planned: allocations not placed at their table's offset (another size than the
  // table's, or bytes not free there), placed by best fit instead. 0 when the run is the traced one.
  std::uint64_t placement_misses = 0;
  // 1 - allocated / reserved: the share of reserved memory not in live blocks.
  double fragmentation() const {
    return reserved ? 1.0 - static_cast<double>(allocated) / static_cast<double>(reserved) : 0.0;
  }
};

// How a free block is chosen for an allocation (ArenaOptions::placement). Every placement keeps a
// segment's untouched tail for last (first fit goes in address order, where a one-segment arena's
// tail comes last), so each lays a one-segment arena out the same whatever its capacity. Which one
// needs the least memory depends on the run's allocation sequence: the memory planner dry-runs a
// plan under each and gives every rank the one with the lowest high_water (RankPlan, memory/plan.h).
enum class BlockPlacement : std::uint8_t {
  BestFit,   // the smallest free block that fits (lowest address among equals)
  FirstFit,  // the lowest-address free block that fits
  // Model states and buffers (every category but activations) by first fit, activations by best
  // fit: the states pack at the low end, the activations fill the holes above.
  StatesLow,
  // Small blocks (below kSmallBlockBytes) by first fit, large ones by best fit: the many small
  // blocks (norm statistics, losses, small weights) pack at the low end instead of splitting the
  // holes that large blocks leave.
  SmallLow,
  // Activations by first fit, model states and buffers by best fit: the records and temporaries,
  // which come and go every unit, pack at the low end; the states fill the holes above.
  ActivationsLow,
  // Model states, buffers and small blocks by first fit, large activations by best fit.
  StatesAndSmallLow,
  // Each allocation at the offset of ArenaOptions::table (memory/placement_table.h), computed
  // offline from a dry run's trace; one the table does not foresee by best fit (placement_misses).
  Planned,
};
constexpr std::size_t kOnlinePlacements = 6;  // the placements before Planned: rules, no table
constexpr std::size_t kSmallBlockBytes = 64 << 10;
// "best-fit" | "first-fit" | "states-low" | "small-low" | "activations-low" | "states-and-small-low" |
// "planned"
const char* to_string(BlockPlacement p);

struct ArenaOptions {
  std::string what = "device";                       // "device", "pinned host": names errors
  std::string budget_knob = "memory.device_budget";  // the knob an OOM report tells users to raise
  std::size_t budget = SIZE_MAX;
  std::size_t segment_bytes = 32ull << 20;  // growth granularity; larger requests get their own segment
  bool grow = true;                         // false: only reserve() adds segments (a fixed pool)
  // The fit policy. A fixed pool uses FirstFit: its layout then does not depend on the pool's size
  // even over several segments, so high_water from a run with a big pool is the exact size it needs.
  BlockPlacement placement = BlockPlacement::BestFit;
  // BlockPlacement::Planned: the offsets from the base of the arena's first segment (a budgeted
  // device arena has one). Without a table Planned places by best fit.
  std::shared_ptr<const PlacementTable> table;
  // Keep the allocation trace (allocation_trace()): what plan_placement() reads.
  bool record_allocations = false;
  // Backend: take and give back one segment (e.g. Device::allocate / deallocate). `give` is called
  // only after every stream that used the segment has passed its last use.
  std::function<void*(std::size_t)> take;
  std::function<void(void*)> give;
  std::string advice;  // appended to OOM reports ("raise ..., or ...")
};

class BlockArena final : public Allocator {
 public:
  // `home`: the stream allocations are ordered on unless allocate_on() names another.
  BlockArena(Device& device, Stream& home, ArenaOptions options);
  ~BlockArena() override;  // waits for the streams, then gives every segment back
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  std::shared_ptr<Storage> allocate(std::size_t bytes) override;  // on the home stream
  // A block whose first user is stream `s`: s waits for the last uses of any reused bytes.
  std::shared_ptr<Storage> allocate_on(std::size_t bytes, Stream& s) override;
  Device& device() override;

  // Adds one segment of `bytes` now (a pool sized at start-up). Counts against the budget.
  void reserve(std::size_t bytes);
  // Gives every fully free segment back to the backend (host-waits on their streams).
  void release_cached();

  ArenaStats stats() const;
  // A training step starts: under a planned placement the next allocation takes the table's entry
  // of a step's first allocation (PlacementTable::step_start: the first step's on the first call,
  // the period's after), so what was allocated between steps (a checkpoint's gather buffers) does
  // not shift the steps' entries. Without a table nothing changes.
  void begin_step();
  // Every allocation so far with its lifetime on the arena's event clock (ArenaOptions::
  // record_allocations; empty without it).
  AllocationTrace allocation_trace() const;
  void reset_peak();  // peak_* := current

  // Memory counters for `stp profile` (base/trace.h): while a recorder is attached, every
  // allocation and free adds a counter sample `name` for rank `pid` whose series are the live
  // bytes by category right after the change (host program order, so the largest sum equals
  // stats().peak_allocated), stamped when the home stream reaches that point (enqueue_host), so
  // the curve lines up with the stream spans. nullptr detaches (also done by the destructor).
  // Without a recorder the cost is one pointer test under the lock the change holds anyway.
  void set_trace(TraceRecorder* recorder, int pid, std::string name = trace::track::kDeviceMemory);

  // Allocations made while a CategoryScope lives are counted under `c` (default: Activations).
  MemoryCategory category() const;
  class CategoryScope {
   public:
    CategoryScope(BlockArena& arena, MemoryCategory c);
    ~CategoryScope();
    CategoryScope(const CategoryScope&) = delete;
    CategoryScope& operator=(const CategoryScope&) = delete;

   private:
    BlockArena& arena_;
    MemoryCategory previous_;
  };

  struct State;  // shared with the storages, which may outlive the arena object

 private:
  std::shared_ptr<State> state_;
};

// Options for an arena over `device`'s memory (Device::allocate / deallocate), the caching device
// allocator: segments of 32 MiB (or the request), growing up to `budget`.
ArenaOptions device_arena_options(Device& device, std::size_t budget = SIZE_MAX);

// The category scope of an allocator that may or may not be an arena (tests use DeviceAllocator).
class MaybeCategoryScope {
 public:
  MaybeCategoryScope(Allocator& alloc, MemoryCategory c);
  ~MaybeCategoryScope();
  MaybeCategoryScope(const MaybeCategoryScope&) = delete;
  MaybeCategoryScope& operator=(const MaybeCategoryScope&) = delete;

 private:
  std::unique_ptr<BlockArena::CategoryScope> scope_;
};

}  // namespace stp
