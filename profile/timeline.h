// A trace regrouped per rank: each rank's spans by lane in time order, its training steps and its
// memory counters — the view every analysis (overlap.h, calibrate.h, memory.h, render_svg.h) reads.
//
// Steps: `stp train` wraps each step of each rank in a "step N" span on compute (cat "step").
// A trace without them (a synthetic trace, another tool's) is one window covering the rank's
// spans, numbered step 0.
#pragma once

#include <cstdint>
#include <vector>

#include "profile/trace_events.h"

namespace stp::profile {

struct StepWindow {
  std::int64_t step = 0;
  double begin = 0, end = 0;  // µs
};

struct RankTimeline {
  int pid = 0;
  std::vector<const Span*> lanes[kLanes];                    // every span of each lane, by start (compute: units only)
  std::vector<const Span*> ops;                              // compute "op" spans, by start
  std::vector<StepWindow> steps;                             // by start
  std::vector<const Counter*> device_memory, pinned_memory;  // trace::track's two, by time
  const std::vector<const Span*>& units() const { return lanes[static_cast<int>(Lane::Compute)]; }
  const std::vector<const Span*>& lane(Lane l) const { return lanes[static_cast<int>(l)]; }
};

// One timeline per rank that has spans or counters, by pid. The trace must outlive the result.
std::vector<RankTimeline> timelines(const Trace& trace);

// Which steps an analysis covers: all (default) or [first, last].
struct StepFilter {
  std::int64_t first = INT64_MIN, last = INT64_MAX;
  bool covers(std::int64_t step) const { return step >= first && step <= last; }
};

// The spans of `v` (sorted by start) that start inside [a, b).
std::vector<const Span*> starting_in(const std::vector<const Span*>& v, double a, double b);

}  // namespace stp::profile
