// Timed training runs of bench_memory's cost parts (tools/bench/bench_memory.cpp, parts 2 to 4): a
// trainer of a config, one warm-up step, then measured steps, with what the last step proves about
// the run's plan.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "train/trainer.h"

namespace stp::bench_memory {

struct StepTimes {
  double step_ms = 0;   // median step time
  double stall_ms = 0;  // median over steps of the largest per-device compute stall on reloads
  double copy_ms = 0;   // median over steps of the largest per-device D2H + H2D busy time
  // Every device's measured peak equals the run's plan (checked after the last step).
  bool peaks_equal = false;
  // Parameter streaming of the last step: every device's bytes each way equal the plan's per step.
  bool stream_bytes_equal = false;
  std::uint64_t stream_bytes = 0;   // of the last step, both directions, the largest device
  std::uint64_t stream_copies = 0;  // of the last step, both directions, the largest device
  // The process's CPU time (user + system) per measured step: the work, apart from waits and from
  // the share of a machine other jobs also load.
  double cpu_ms = 0;
};

// A trainer of c: one warm-up step, then `steps` measured ones; their medians, the last step's
// checks against the run's plan, and the speculations of the measured steps added into
// *speculation when given.
StepTimes run_steps(const stp::Config& c, int steps, stp::StepResult::Speculation* speculation = nullptr);

}  // namespace stp::bench_memory
