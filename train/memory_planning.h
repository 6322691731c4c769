// Memory planning for a training config: builds the planner's input (memory/planner.h) from the
// model and schedule, and evaluates candidate plans by dry runs of the trainer
// (TrainerOptions::dry_run), whose allocation sequence is the real run's. Used by Trainer (before
// any step) and by `stp plan`.
#pragma once

#include "config/config.h"
#include "memory/plan.h"

namespace stp {

// Always returns a plan; `feasible` is false when nothing fits memory.device_budget.
// min_device_budget is the exact minimum feasible budget (the strongest plan placed by the real
// allocator; a dozen dry runs) when `exact_minimum` is set or the budget is infeasible; otherwise
// it may be the cheaper lower bound, the strongest plan's live-byte peak (min_budget_exact says).
MemoryPlan make_memory_plan(const Config& config, bool exact_minimum = false);

// Throws stp::Error (before any step) when the plan is infeasible — naming the budget, the minimum
// feasible budget and what consumes it — or when the pinned pools exceed memory.host_budget.
void check_plan(const MemoryPlan& plan, const Config& config);

}  // namespace stp
