// The parts of bench_memory, each printing its own section (tools/bench/bench_memory.cpp describes
// what each measures and its target).
#pragma once

#include "tools/bench/bench_memory/common.h"

namespace stp::bench_memory {

// Part 1: the largest depth each lever set fits in --budget, one real step of it, the ratios.
void capacity(const Options& o);

// Part 2: step time at 60% of the unconstrained peak against the unconstrained step.
void cost(const Options& o);

// Part 3: step time at a budget that moves optimizer state to the host.
void optimizer_cost(const Options& o);

// Part 3b: every optimizer on the host, optimizer overlap none against all.
void overlap_cost(const Options& o);

// Part 4: step time at a budget that only parameter streaming fits.
void stream_cost(const Options& o);

}  // namespace stp::bench_memory
