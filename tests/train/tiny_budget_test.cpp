// The shipped tiny job (configs/tiny.yaml: GPT-2, 4 layers, n_embd 128, tp 2, pp 2, m 8) under
// low device budgets: for each schedule, with the optimizer on the device and in pinned host memory,
// the planner's minimum stays at or below the measured share of the unconstrained peak
// (docs/memory.md), and a real run at that minimum peaks exactly as predicted, every device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"

namespace {

stp::Config tiny_yaml(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"output.dir=" + std::string(STP_BINARY_DIR) + "/tests/tiny_budget_run", "output.trace=false"});
  return stp::load_config(std::string(STP_SOURCE_DIR) + "/configs/tiny.yaml", overrides);
}

std::size_t max_peak(const stp::MemoryPlan& plan) {
  std::size_t p = 0;
  for (const auto& r : plan.predicted) p = std::max(p, r.peak_device_bytes);
  return p;
}

struct Case {
  const char* schedule;
  const char* optimizer_offload;  // memory.optimizer_offload
  double max_percent;             // the minimum, in percent of the unconstrained peak, must not exceed this
};

class TinyBudgets : public testing::TestWithParam<Case> {};

// The planner's exact minimum, as a percent of the unconstrained peak (no levers, optimizer on the
// device), is at most the measured value, and a run at exactly that budget trains two steps (the
// dry run's two: the second has the optimizer state) with every device's measured peak equal to
// the plan's.
TEST_P(TinyBudgets, MinimumBudgetTrainsExactlyAsPlanned) {
  const Case c = GetParam();
  const std::string sched = std::string("parallel.schedule=") + c.schedule;
  const std::string placement = std::string("memory.optimizer_offload=") + c.optimizer_offload;
  const std::size_t unconstrained = max_peak(stp::make_memory_plan(
      tiny_yaml({sched, "memory.offload=none", "memory.recompute=none", "memory.device_budget=null"})));
  const std::size_t minimum =
      stp::make_memory_plan(tiny_yaml({sched, placement, "memory.device_budget=1MiB"}), /*exact_minimum=*/true)
          .min_device_budget;
  const double percent = 100.0 * static_cast<double>(minimum) / static_cast<double>(unconstrained);
  SCOPED_TRACE(testing::Message() << "minimum " << minimum << " B = " << percent << "% of " << unconstrained);
  EXPECT_LE(percent, c.max_percent) << "the planner needs more than before";
  stp::testing::TrainRun r =
      stp::testing::run_training(tiny_yaml({sched, placement, "memory.device_budget=" + std::to_string(minimum)}), 2);
  stp::testing::expect_memory_as_planned(r, minimum);
}

// Every budget at or above the minimum places (the device arena's layout does not depend on its
// capacity): budgets above the stp minimum, odd ones included, train exactly as planned, and one
// just below it is refused before step 1. (11882250 B, between the minimum best fit happened to
// reach and the one it needed in general, once passed the planner and ran out of memory in step
// 1: best fit could take the segment's tail, so the layout changed with the budget.)
TEST(TinyBudgetsAroundTheMinimum, AboveTrainsAsPlannedBelowIsRefused) {
  const std::string sched = "parallel.schedule=stp";
  const std::size_t minimum =
      stp::make_memory_plan(tiny_yaml({sched, "memory.device_budget=1MiB"}), /*exact_minimum=*/true).min_device_budget;
  EXPECT_FALSE(
      stp::make_memory_plan(tiny_yaml({sched, "memory.device_budget=" + std::to_string(minimum - 256)})).feasible);
  for (std::size_t budget :
       stp::testing::sweep<std::size_t>({minimum + 1, minimum + 4097, minimum + 65539}, {minimum + 4097})) {
    SCOPED_TRACE(testing::Message() << "budget " << budget << ", minimum " << minimum);
    stp::testing::TrainRun r =
        stp::testing::run_training(tiny_yaml({sched, "memory.device_budget=" + std::to_string(budget)}), 2);
    stp::testing::expect_memory_as_planned(r, budget);
  }
}

// Measured (vocab-parallel head, tp 2): with the optimizer on the device the strongest plan keeps
// the model states and the activations no lever moves (unit inputs, sets in flight, the head);
// with memory.optimizer_offload: all the AdamW moments leave the device too, and every schedule
// meets 35% of the unconstrained peak. docs/memory.md.
INSTANTIATE_TEST_SUITE_P(Schedules, TinyBudgets,
                         testing::Values(Case{"stp", "none", 42.1}, Case{"zb-v", "none", 46.5},
                                         Case{"1f1b-i", "none", 36}, Case{"stp", "all", 33.5},
                                         Case{"zb-v", "all", 34.7}, Case{"1f1b-i", "all", 26.3}),
                         [](const testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.schedule) + "_" + i.param.optimizer_offload;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
