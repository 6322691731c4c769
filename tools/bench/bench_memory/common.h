// What every part of bench_memory shares (tools/bench/bench_memory.cpp describes the parts): the
// command line's options, the configs of a run (the --config job with --set and the part's own
// overrides), whether a config's plan fits, and the numbers the tables print.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/config.h"
#include "memory/planner.h"

namespace stp::bench_memory {

struct Options {
  std::string config = "configs/tiny.yaml";
  std::string budget = "40MiB";
  std::string link = "4GB/s";
  int copy_cpus = 1;  // memory.copy_engine_cpus for the cost runs (both of each pair)
  int steps = 3;      // measured steps per run (after one warm-up step)
  int pairs = 3;      // plain/planned run pairs
  int max_layers = 256;
  int stream_layers = 16;  // model.n_layer of the streaming cost part (0: the config's)
  std::vector<std::string> overrides;
};

// The median of v (the upper one of an even count); 0 when v is empty.
double median(std::vector<double> v);

// Bytes in MiB.
double mib(std::size_t b);

// The largest device's predicted peak of a plan.
std::size_t max_peak(const stp::MemoryPlan& plan);

// The --config job with --set, no trace, the bench's output folder, --link as
// memory.link_bandwidth, then `extra` (later assignments win).
stp::Config config_with(const Options& o, std::vector<std::string> extra);

// Whether c's memory plan fits as `stp train` requires (check_plan: the device and host budgets);
// the plan into *out when given.
bool fits(const stp::Config& c, stp::MemoryPlan* out = nullptr);

}  // namespace stp::bench_memory
