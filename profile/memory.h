// The memory side of a rank, from its device and pinned memory counters (trace::track in
// base/trace_names.h: the caching allocator's live bytes by category, memory/block_arena.h set_trace):
//
//   peak_device / peak_pinned   the largest total of any sample — over the whole trace, so it
//                               equals the run's metrics.jsonl peak_device_bytes for that device;
//   high_water                  the `top` highest local maxima of the device curve in the steps
//                               analysed, at most one per op of the schedule (so they show
//                               different moments of the step, not the same peak every step),
//                               each with its live bytes by category and the op running then.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "profile/timeline.h"

namespace stp::profile {

struct MemoryMoment {
  double ts_us = 0;
  std::int64_t step = 0;    // the step window it falls in
  double into_step_ms = 0;  // since that window began
  double total = 0;         // bytes
  std::vector<std::pair<std::string, double>> by_category;
  std::string op;  // op running on compute then ("" if none)
};

struct MemoryReport {
  double peak_device = 0, peak_pinned = 0;  // bytes
  bool has_device = false, has_pinned = false;
  std::vector<MemoryMoment> high_water;  // highest first
};

MemoryReport memory_report(const Trace& trace, const RankTimeline& rank, const StepFilter& filter = {}, int top = 3);

}  // namespace stp::profile
