#include "memory/placement_table.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "base/error.h"

namespace stp {

PlacementTable::PlacementTable(std::vector<Entry> entries, std::uint64_t first_step, std::uint64_t period_start,
                               std::uint64_t period)
    : entries_(std::move(entries)), first_step_(first_step), period_start_(period_start), period_(period) {
  STP_ASSERT(period_start_ + period_ == entries_.size() && (period_ > 0 || period_start_ == entries_.size()),
             "placement table: the period must end the entries");
  for (const Entry& e : entries_) high_water_ = std::max(high_water_, e.offset + e.size);
}

const PlacementTable::Entry& PlacementTable::at(std::uint64_t ordinal) const {
  static const Entry kNone{};
  if (ordinal >= entries_.size()) {
    if (period_ == 0) return kNone;
    ordinal = period_start_ + (ordinal - period_start_) % period_;
  }
  return entries_[static_cast<std::size_t>(ordinal)];
}

std::uint64_t PlacementTable::digest() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the numbers
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  mix(first_step_), mix(period_start_), mix(period_);
  for (const Entry& e : entries_) mix(e.size), mix(e.offset);
  return h;
}

namespace {

struct Interval {
  std::uint64_t from, to;  // event clock, [from, to)
};

// One block to place: an allocation of the setup or the first step (one interval), or an allocation
// of the period with its twin of the third step (two intervals, one offset).
struct Item {
  std::size_t size = 0;
  Interval live[2] = {};
  int intervals = 0;
  std::uint64_t lifetime() const {
    std::uint64_t t = 0;
    for (int k = 0; k < intervals; ++k) t += live[k].to - live[k].from;
    return t;
  }
};

bool overlap(const Item& a, const Item& b) {
  for (int i = 0; i < a.intervals; ++i)
    for (int j = 0; j < b.intervals; ++j)
      if (a.live[i].from < b.live[j].to && b.live[j].from < a.live[i].to) return true;
  return false;
}

// The interval graph: per item, the items alive at some time it is. The same for every order, so
// it is built once (the pairs are the quadratic part of the layout).
std::vector<std::vector<std::uint32_t>> conflicts(const std::vector<Item>& items) {
  std::vector<std::vector<std::uint32_t>> out(items.size());
  for (std::size_t i = 0; i < items.size(); ++i)
    for (std::size_t j = i + 1; j < items.size(); ++j)
      if (overlap(items[i], items[j]))
        out[i].push_back(static_cast<std::uint32_t>(j)), out[j].push_back(static_cast<std::uint32_t>(i));
  return out;
}

// Greedy over the interval graph in `order`: each item at the lowest offset where it overlaps no item
// placed before it that is alive at the same time, or (`tightest`) in the smallest such gap between
// them (the lowest among equals; above them all only when no gap holds it). Returns the offsets by
// item.
std::vector<std::size_t> lay_out(const std::vector<Item>& items, const std::vector<std::vector<std::uint32_t>>& graph,
                                 const std::vector<std::size_t>& order, bool tightest) {
  std::vector<std::size_t> offset(items.size(), 0);
  std::vector<char> placed(items.size(), 0);
  std::vector<std::pair<std::size_t, std::size_t>> taken;  // [begin, end) of the conflicting items
  for (std::size_t i : order) {
    taken.clear();
    for (std::uint32_t j : graph[i])
      if (placed[j]) taken.emplace_back(offset[j], offset[j] + items[j].size);
    std::sort(taken.begin(), taken.end());
    const std::size_t size = items[i].size;
    std::size_t at = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
    for (const auto& [begin, end] : taken) {
      if (at + size <= begin) {
        if (!tightest) break;
        if (begin - at < best_gap) best_gap = begin - at, best = at;
      }
      at = std::max(at, end);
    }
    offset[i] = best != SIZE_MAX ? best : at;
    placed[i] = 1;
  }
  return offset;
}

// The steady-state check of one period allocation against its twin of the next step.
bool twins(const AllocationRecord& a, const StepMark& a_step, const AllocationRecord& b, const StepMark& b_step,
           std::uint64_t end_events) {
  if (a.size != b.size || a.allocated_at - a_step.events != b.allocated_at - b_step.events) return false;
  if (a.freed_at == AllocationRecord::kAlive || a.freed_at > b.allocated_at) return false;  // would meet its twin
  if (b.freed_at != AllocationRecord::kAlive) return a.freed_at - a_step.events == b.freed_at - b_step.events;
  return a.freed_at - a_step.events >= end_events - b_step.events;
}

}  // namespace

std::optional<PlacementTable> plan_placement(const AllocationTrace& trace, const std::vector<StepMark>& steps,
                                             std::uint64_t end_events) {
  STP_ASSERT(steps.size() == 4, "plan_placement: the marks before steps 1, 2, 3 and after step 3");
  const std::uint64_t start = steps[1].allocations, period = steps[2].allocations - steps[1].allocations;
  if (period == 0 || steps[3].allocations - steps[2].allocations != period || trace.size() != steps[3].allocations ||
      start + period > kMaxPlannedAllocations)
    return std::nullopt;
  std::vector<Item> items;
  auto interval = [end_events](const AllocationRecord& r) {
    return Interval{r.allocated_at, r.freed_at == AllocationRecord::kAlive ? end_events : r.freed_at};
  };
  for (std::uint64_t k = 0; k < start; ++k) items.push_back(Item{trace[k].size, {interval(trace[k])}, 1});
  for (std::uint64_t i = 0; i < period; ++i) {
    const AllocationRecord& a = trace[start + i];
    const AllocationRecord& b = trace[start + period + i];
    if (!twins(a, steps[1], b, steps[2], end_events)) return std::nullopt;
    items.push_back(Item{a.size, {interval(a), interval(b)}, 2});
  }
  std::vector<std::function<bool(std::size_t, std::size_t)>> orders = {
      [&](std::size_t x, std::size_t y) { return items[x].size > items[y].size; },
      [&](std::size_t x, std::size_t y) {
        return items[x].size * items[x].lifetime() > items[y].size * items[y].lifetime();
      },
      [&](std::size_t x, std::size_t y) { return items[x].lifetime() > items[y].lifetime(); },
  };
  const std::vector<std::vector<std::uint32_t>> graph = conflicts(items);
  std::vector<std::size_t> best;
  std::size_t best_high = SIZE_MAX;
  for (const auto& before : orders) {
    std::vector<std::size_t> order(items.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), before);  // ties: allocation order
    for (bool tightest : {false, true}) {
      std::vector<std::size_t> offset = lay_out(items, graph, order, tightest);
      std::size_t high = 0;
      for (std::size_t i = 0; i < items.size(); ++i) high = std::max(high, offset[i] + items[i].size);
      if (high < best_high) best_high = high, best = std::move(offset);
    }
  }
  std::vector<PlacementTable::Entry> entries;
  for (std::size_t i = 0; i < items.size(); ++i) entries.push_back({items[i].size, best[i]});
  return PlacementTable(std::move(entries), steps[0].allocations, start, period);
}

}  // namespace stp
