// The capacity search of bench_memory (part 1, tools/bench/bench_memory.cpp): the largest depth whose
// plan under a lever set fits the budget, found by probes that each print a line.
#pragma once

#include <string>
#include <vector>

#include "memory/planner.h"
#include "tools/bench/bench_memory/common.h"

namespace stp::bench_memory {

// The strongest form of a lever set: each `auto` lever forced on (offload, optimizer_offload and
// param_offload: all; recompute: full). Its plan is the planner's most (memory/planner.h: the
// feasibility test of every search under these levers), so where it does not fit neither does the
// set; it costs a few dry runs, where the planner's search of a deep model costs one per greedy
// round. Empty when the set has no auto lever: then nothing is cheaper than the set itself.
std::vector<std::string> strongest_levers(const std::vector<std::string>& levers);

struct Probe {
  bool fits = false;
  bool places = false;  // the strongest plan's placeable minimum is within the budget
  stp::MemoryPlan plan;
};

// One probe of the capacity search, printed when it ends (the search of a deep model takes minutes,
// and the lines show it progressing). The planner's probe fits as `stp train` requires (check_plan:
// the device and the host budget). The strongest plan's is an upper bound: it "fits" when its live
// bytes do, the planner's own feasibility test (a weaker plan may place in a budget where the
// strongest one's placement does not), on the device budget alone (it pins the most host memory).
Probe probe(const Options& o, const std::vector<std::string>& levers, int layers, bool strongest);

struct Depth {
  int layers = 0;  // 0: not even one step of layers fits
  // The planner's plan at `layers`, or the strongest plan's where it places in the budget and the
  // planner was not probed there (its search of a deep model takes tens of minutes).
  stp::MemoryPlan plan;
};

// Largest n_layer (a multiple of `step`, at most --max-layers) whose plan under `levers` fits.
// `known`: a depth known to fit (the previous row's: each row's levers include the row before's, so
// it fits at least as deep), or 0. The strongest plan bounds the depth from both sides at a few dry
// runs a probe: above, where its live bytes exceed the budget no plan fits (doubling from `known`,
// then bisection); below, where it places in the budget the planner's plan fits (every budget at or
// above the strongest plan's placeable minimum ends feasible: train/memory_planning.cpp, pass 3).
// Only between the two does the planner search, by bisection. Without a strongest form (no auto
// lever) the planner's own probes are the bounds.
Depth largest_depth(const Options& o, const std::vector<std::string>& levers, int step, int known);

}  // namespace stp::bench_memory
