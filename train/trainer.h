// Trainer: one process's training run. Builds pp × tp ranks (one device, one host thread and one
// executor each; global rank = pp_rank * tp + tp_rank, TP innermost), the communicators between
// them, each rank's stages, optimizer and gradient clipper, and runs optimizer steps.
//
// Usage (tools/cmd_train.cpp, tests):
//   Trainer t(cfg);                     // validates the config against schedule and model, builds ranks
//   StepResult r = t.step();            // one optimizer step over train.microbatches microbatches
//   auto full = t.full_parameters();    // HF-named full tensors gathered from every shard
//   t.save_checkpoint(); / Trainer t2(cfg) with train.resume = path
//
// One step on each rank: zero grads; upload this step's tokens/targets; walk the op list
// (train/executor.h); sum tied embedding grads; global-norm clip over all ranks; AdamW.
// Ranks run on their own threads; an error on one rank aborts every communicator so no rank
// hangs, and the first error is rethrown by step().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/trace.h"
#include "memory/plan.h"
#include "models/safetensors.h"

namespace stp {

struct StepResult {
  std::int64_t step = 0;          // 1-based step just completed
  double loss = 0;                // mean over microbatches of the mean token cross-entropy
  double lr = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  // Per device (global rank order), since start: bytes in live blocks of the caching allocator
  // (what the planner predicts exactly), and bytes it reserved from the device (<= the budget).
  std::vector<std::uint64_t> peak_device_bytes;
  std::vector<std::uint64_t> peak_device_reserved_bytes;
  std::uint64_t peak_host_pinned_bytes = 0;
  // This step's activation offload per device (global rank order; empty when nothing offloads).
  struct Offload {
    std::uint64_t d2h_bytes = 0, h2d_bytes = 0;
    double d2h_busy_s = 0, h2d_busy_s = 0;  // copy-stream time spent copying (bytes / busy = rate)
    double stall_s = 0;                     // compute waited for reloads
  };
  std::vector<Offload> offload;
};

struct TrainerOptions {
  // Dry run (core/cpu/dry_stream.h): devices that count allocations and run nothing, no data
  // read, no initialisation — how the planner predicts a real run's memory exactly.
  bool dry_run = false;
  // Use this plan instead of planning (dry runs of the planner; tests).
  const MemoryPlan* plan = nullptr;
};

class Trainer {
 public:
  // Plans memory (memory/planner.h) unless options.plan is given; throws stp::Error before any
  // step when no plan fits memory.device_budget or the pinned pools exceed memory.host_budget.
  explicit Trainer(const Config& config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepResult step();
  std::int64_t steps_done() const;

  // Full tensors with HF GPT-2 names, gathered from every rank's shards.
  std::map<std::string, HostTensor> full_parameters();
  // Writes output.dir/checkpoint-STEP (model, optimizer, state); returns its path.
  std::string save_checkpoint();
  // Trace of everything recorded so far (output.trace: true), or nullptr.
  const TraceRecorder* trace() const;
  int world_size() const;
  const MemoryPlan& memory_plan() const;
  // Per device (global rank): the caching allocator's statistics, offload counters and the
  // pinned pool's statistics (zero when the rank does not offload).
  struct DeviceMemory {
    ArenaStats device;
    ArenaStats pinned;
    std::uint64_t d2h_bytes = 0, h2d_bytes = 0, late_prefetches = 0;
  };
  std::vector<DeviceMemory> device_memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stp
