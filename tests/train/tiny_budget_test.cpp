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

// A known planner defect (docs/memory.md, Known gaps): on configs/tiny.yaml with stp and the
// vocab-parallel head, memory.device_budget = 11882250 B (48% of the unconstrained peak, above the
// 11748432 B minimum) passes the planner's dry-run placement check, yet the real run runs out of
// device memory in step 1 (fragmentation: 10.8 MiB live, largest free block 254 KiB of a 256 KiB
// request). Budgets of 11.8 and 12.0 MB train as planned. Enable once the dry run and the real run
// agree here.
TEST(TinyBudgetsKnownGap, DISABLED_StpAtFortyEightPercentTrainsAsPlanned) {
  stp::testing::TrainRun r = stp::testing::run_training(tiny_yaml({"memory.device_budget=11882250"}), 2);
  stp::testing::expect_memory_as_planned(r, 11882250);
}

// Measured (vocab-parallel head, tp 2): with the optimizer on the device the strongest plan keeps
// the model states and the activations no lever moves (unit inputs, sets in flight, the head);
// with memory.optimizer_offload: all the AdamW moments leave the device too. docs/memory.md.
INSTANTIATE_TEST_SUITE_P(Schedules, TinyBudgets,
                         testing::Values(Case{"stp", "none", 48}, Case{"zb-v", "none", 56}, Case{"1f1b-i", "none", 44},
                                         Case{"stp", "all", 40}, Case{"zb-v", "all", 47}, Case{"1f1b-i", "all", 35}),
                         [](const testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.schedule) + "_" + i.param.optimizer_offload;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
