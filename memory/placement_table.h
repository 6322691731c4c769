// An offline block placement: the address of every allocation of a run, computed before the run
// from a dry run's allocation trace (BlockPlacement::Planned, memory/block_arena.h).
//
// Allocation and free happen in host program order, identically on every run (memory/block_arena.h,
// Determinism), so a dry run knows every allocation's size and lifetime. plan_placement() lays them
// out offline over the interval graph (each block at the lowest offset where it overlaps no block
// placed before it that is alive at the same time; larger blocks first), which an online rule,
// seeing one allocation at a time, cannot do.
//
// A run is its setup, then steps; from the second step on every step allocates and frees the same
// sequence (the steady state). The trace covers the setup and three steps; the table stores the
// offsets of the setup, the first step and one period (the second step), laid out so that the
// third step at the second step's offsets is conflict-free too. By induction every later step
// repeats the period at the same offsets: allocation ordinal k >= period_start + period takes the
// entry of period_start + (k - period_start) % period.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace stp {

// What an arena records when ArenaOptions::record_allocations is set: every allocation in order,
// with its aligned size and the arena's event clock (allocations plus frees so far) at its
// allocation and at its free (kAlive while live).
struct AllocationRecord {
  static constexpr std::uint64_t kAlive = UINT64_MAX;
  std::size_t size = 0;
  std::uint64_t allocated_at = 0, freed_at = kAlive;
  bool operator==(const AllocationRecord&) const = default;
};
using AllocationTrace = std::vector<AllocationRecord>;

// Where one step of a traced run starts: the arena's allocation count and event clock before it.
struct StepMark {
  std::uint64_t allocations = 0, events = 0;
};

class PlacementTable {
 public:
  struct Entry {
    std::size_t size = 0;    // the aligned size the allocation must have
    std::size_t offset = 0;  // from the segment's base
  };
  // `first_step`: the ordinal of the first step's first allocation (the setup's length).
  PlacementTable(std::vector<Entry> entries, std::uint64_t first_step, std::uint64_t period_start,
                 std::uint64_t period);

  // The entry of allocation `ordinal` (0-based: the setup's, then the steps' in order).
  const Entry& at(std::uint64_t ordinal) const;
  // The ordinal a step's first allocation has: the first step's, or (every later step) the period's.
  std::uint64_t step_start(bool first) const { return first ? first_step_ : period_start_; }
  std::size_t high_water() const { return high_water_; }  // furthest end of an entry
  std::size_t entries() const { return entries_.size(); }
  std::uint64_t period_start() const { return period_start_; }
  std::uint64_t period() const { return period_; }
  // A digest of the entries and the period (equal tables, equal digests; memo keys).
  std::uint64_t digest() const;

 private:
  std::vector<Entry> entries_;
  std::uint64_t first_step_, period_start_, period_;
  std::size_t high_water_ = 0;
};

// The table for a run traced over its setup and three steps (`steps`: the marks before steps 1, 2
// and 3, and after step 3). nullopt when the trace is not a steady state: the third step allocates
// another sequence than the second (sizes, or lifetimes relative to the step's start), or a block
// of the second step lives until its twin of the third is allocated; and when the table would hold
// more than kMaxPlannedAllocations entries (the layout is quadratic in them). Of the layouts by
// three orders (size, size x lifetime, lifetime) each at the lowest offset or in the tightest gap,
// the one with the lowest high water.
constexpr std::size_t kMaxPlannedAllocations = 20000;
std::optional<PlacementTable> plan_placement(const AllocationTrace& trace, const std::vector<StepMark>& steps,
                                             std::uint64_t end_events);

}  // namespace stp
