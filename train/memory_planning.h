// Memory planning for a training config: builds the planner's input (memory/planner.h) from the
// model and schedule, and evaluates candidate plans by dry runs of the trainer
// (TrainerOptions::dry_run), whose allocation sequence is the real run's. Used by Trainer (before
// any step) and by `stp plan`.
//
// Four passes (memory_planning.cpp, each a function with its contract): measure (per-unit lever
// bytes and costs, model-state bytes per chunk, compute time; no dry run), choose levers
// (plan_memory on those numbers, priced by the dry-run cost model), verify by dry run (the choice
// placed under the real budget; re-chosen for less on fragmentation), report (model states on the
// device and the host, CPU optimizer time, summary lines).
#pragma once

#include "base/error.h"
#include "config/config.h"
#include "memory/plan.h"
#include "train/memory_settings.h"

namespace stp {

// Always returns a plan; `feasible` is false when nothing fits memory.device_budget.
// min_device_budget is the exact minimum feasible budget (the strongest plan placed by the real
// allocator; a dozen dry runs) when `exact_minimum` is set or the budget is infeasible; otherwise
// it may be the cheaper lower bound, the strongest plan's live-byte peak (min_budget_exact says).
MemoryPlan make_memory_plan(const Config& config, bool exact_minimum = false);

// Throws stp::Error (before any step) when the plan is infeasible — naming the budget, the minimum
// feasible budget and what consumes it — or when the pinned pools exceed memory.host_budget. Sizes
// are written once each, in `style` (`stp plan --bytes`: Exact); a minimum is rounded up.
// The pinned checks use this process's part of the plan (train/host_needs.h). `settings` defaults
// to memory_settings(config) (tests pass a fake machine's).
void check_plan(const MemoryPlan& plan, const Config& config, ByteStyle style = ByteStyle::Human);
void check_plan(const MemoryPlan& plan, const Config& config, const MemorySettings& settings,
                ByteStyle style = ByteStyle::Human);

// The run against the machine it runs on (settings.machine; nothing when its memory is unknown),
// each an stp::Error naming both numbers and the knob: an explicit memory.host_budget larger than
// what the machine has for this process, or the run's host memory (pinned, pageable and the CPU
// backend's devices: train/host_needs.h) larger than that. `stp train` checks it before any step;
// `stp plan`, which may plan for another machine, prints it as a note.
void check_host_machine(const MemoryPlan& plan, const Config& config, const MemorySettings& settings,
                        ByteStyle style = ByteStyle::Human);

}  // namespace stp
