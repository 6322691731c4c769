// The memory levers end to end on the CPU backend (exact peaks): offload, recompute and the
// planner's mix train bitwise like keeping everything; the planner's predicted peaks equal the
// measured ones and stay within the budget; infeasible budgets fail before any step.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/device.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

using stp::testing::TrainRun;

TrainRun train(std::vector<std::string> overrides, int steps = 3) {
  overrides.insert(overrides.begin(), {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4"});
  return stp::testing::run_training(tiny_config(overrides), steps);
}

// Same kernels on the same inputs in the same order: every lever must be bitwise neutral.
// Under a sanitizer: one schedule (MemoryPlanner below runs the planner under the others).
TEST(MemoryLevers, OffloadRecomputeAndThePlannerTrainBitwiseLikeKeepingEverything) {
  for (const char* schedule : stp::testing::sweep<const char*>({"stp", "zb-v", "1f1b-i"}, {"stp"})) {
    SCOPED_TRACE(schedule);
    stp::testing::expect_memory_levers_neutral([](auto o, int steps) { return train(o, steps); },
                                               {std::string("parallel.schedule=") + schedule}, 3,
                                               /*as_planned=*/false);
  }
}

// For budgets from generous down to (nearly) the minimum: the measured peak of every device
// equals the plan's prediction exactly and never exceeds the budget; the pinned pools are exactly
// as large as predicted. Under a sanitizer: the schedules MemoryLevers leaves out, and the two
// tightest budgets.
TEST(MemoryPlanner, PredictedPeaksEqualMeasuredPeaksWithinEveryBudget) {
  for (const char* schedule : stp::testing::sweep<const char*>({"stp", "zb-v", "1f1b-i"}, {"zb-v", "1f1b-i"})) {
    SCOPED_TRACE(schedule);
    std::string sched = std::string("parallel.schedule=") + schedule;
    TrainRun keep = train({sched, "memory.offload=auto", "memory.recompute=auto"}, 2);
    std::size_t generous = keep.peaks[0] * 2;
    stp::MemoryPlan exact = stp::make_memory_plan(tiny_config({"parallel.tp=2", "parallel.pp=2", "model.n_layer=4",
                                                               sched, "memory.offload=auto", "memory.recompute=auto"}),
                                                  /*exact_minimum=*/true);
    ASSERT_TRUE(exact.min_budget_exact);
    std::size_t minimum = exact.min_device_budget;
    EXPECT_GE(minimum, keep.plan.min_device_budget) << "the live-byte bound is above the exact minimum";
    ASSERT_LT(minimum, keep.peaks[0]);
    // min_device_budget is the smallest budget the allocator can place the strongest plan in (live
    // bytes plus fragmentation, found by dry runs): the tightest budget tested is exactly that.
    for (std::size_t budget : stp::testing::sweep<std::size_t>(
             {generous, (keep.peaks[0] + minimum) / 2, minimum + (keep.peaks[0] - minimum) / 4, minimum},
             {minimum + (keep.peaks[0] - minimum) / 4, minimum})) {
      SCOPED_TRACE(budget);
      TrainRun r = train(
          {sched, "memory.offload=auto", "memory.recompute=auto", "memory.device_budget=" + std::to_string(budget)}, 2);
      stp::testing::expect_memory_as_planned(r, budget);
    }
  }
}

TEST(MemoryPlanner, InfeasibleBudgetFailsBeforeAnyStepNamingTheMinimum) {
  try {
    stp::Trainer t(tiny_config({"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", "memory.device_budget=64KiB"}));
    FAIL() << "a 64 KiB budget was accepted";
  } catch (const stp::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("memory.device_budget"), std::string::npos) << what;
    EXPECT_NE(what.find("minimum feasible budget"), std::string::npos) << what;
    EXPECT_NE(what.find("activations"), std::string::npos) << what;
  }
}

TEST(MemoryPlanner, HostBudgetExceededIsAClearError) {
  try {
    stp::Trainer t(tiny_config(
        {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", "memory.offload=all", "memory.host_budget=4KiB"}));
    FAIL() << "a 4 KiB host budget was accepted with offload: all";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.host_budget"), std::string::npos) << e.what();
  }
}

// A CUDA run gives its compute stream a GEMM workspace from the arena (cuBLASLt's); the plan, made
// on dry-run CPU devices, counts it from the configured backend: the same plan plus exactly
// gemm_workspace_bytes of buffers on every device, and a minimum budget that holds them. The CPU
// backend's GEMM takes none, so its plans (and every CPU peak) are unchanged.
TEST(MemoryPlanner, CountsTheGemmWorkspaceOfTheConfiguredBackend) {
  ASSERT_EQ(stp::gemm_workspace_bytes(stp::DeviceKind::Cpu), 0u);
  const std::size_t ws = stp::gemm_workspace_bytes(stp::DeviceKind::Cuda);
  ASSERT_GT(ws, 0u);
  const std::vector<std::string> base = {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4"};
  std::vector<std::string> on_cuda = base;
  on_cuda.push_back("parallel.backend=cuda");
  const stp::MemoryPlan cpu = stp::make_memory_plan(tiny_config(base));
  const stp::MemoryPlan cuda = stp::make_memory_plan(tiny_config(on_cuda));
  ASSERT_EQ(cpu.predicted.size(), cuda.predicted.size());
  const auto buffers = static_cast<std::size_t>(stp::MemoryCategory::Buffers);
  for (std::size_t g = 0; g < cpu.predicted.size(); ++g) {
    SCOPED_TRACE(g);
    EXPECT_EQ(cuda.predicted[g].peak_device_bytes, cpu.predicted[g].peak_device_bytes + ws);
    EXPECT_EQ(cuda.predicted[g].peak_by_category[buffers], cpu.predicted[g].peak_by_category[buffers] + ws);
  }
  EXPECT_GE(cuda.min_device_budget, cpu.min_device_budget + ws);
}

// The fused attention's library workspace (cuDNN's, Stream::set_attention_workspace) is counted the
// same way, and only where the library can run: fused attention in bf16 on a CUDA backend. Every
// other plan (the CPU backend, f32, naive) holds only what it held before.
TEST(MemoryPlanner, CountsTheAttentionWorkspaceOnlyForFusedBf16OnCuda) {
  ASSERT_EQ(stp::attention_workspace_bytes(stp::DeviceKind::Cpu), 0u);
  const std::size_t gemm = stp::gemm_workspace_bytes(stp::DeviceKind::Cuda);
  const std::size_t attention = stp::attention_workspace_bytes(stp::DeviceKind::Cuda);
  ASSERT_GT(attention, 0u);
  const std::vector<std::string> base = {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = base;
    all.insert(all.end(), more.begin(), more.end());
    return tiny_config(all);
  };
  struct Case {
    std::vector<std::string> settings;
    std::size_t extra;  // over the same config on the CPU backend
  };
  const std::vector<Case> cases = {
      {{"train.precision=bf16", "model.attention=fused"}, gemm + attention},
      {{"train.precision=bf16", "model.attention=naive"}, gemm},
      {{"train.precision=f32", "model.attention=fused"}, gemm},
  };
  const auto buffers = static_cast<std::size_t>(stp::MemoryCategory::Buffers);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.settings[0] + " " + c.settings[1]);
    std::vector<std::string> on_cuda = c.settings;
    on_cuda.push_back("parallel.backend=cuda");
    EXPECT_EQ(stp::attention_library_workspace_bytes(with(c.settings)), 0u);
    EXPECT_EQ(stp::attention_library_workspace_bytes(with(on_cuda)), c.extra - gemm);
    const stp::MemoryPlan cpu = stp::make_memory_plan(with(c.settings));
    const stp::MemoryPlan cuda = stp::make_memory_plan(with(on_cuda));
    ASSERT_EQ(cpu.predicted.size(), cuda.predicted.size());
    for (std::size_t g = 0; g < cpu.predicted.size(); ++g) {
      SCOPED_TRACE(g);
      EXPECT_EQ(cuda.predicted[g].peak_device_bytes, cpu.predicted[g].peak_device_bytes + c.extra);
      EXPECT_EQ(cuda.predicted[g].peak_by_category[buffers], cpu.predicted[g].peak_by_category[buffers] + c.extra);
    }
    EXPECT_GE(cuda.min_device_budget, cpu.min_device_budget + c.extra);
  }
}

// After the first step the allocators never go back to the backend: no new segments, and the
// pinned pool is the one segment reserved at start-up.
TEST(MemoryPlanner, PoolsDoNotGrowInSteadyState) {
  stp::Trainer t(tiny_config({"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", "memory.offload=all"}));
  t.step();
  auto after_first = t.device_memory();
  t.step();
  t.step();
  auto later = t.device_memory();
  for (std::size_t g = 0; g < later.size(); ++g) {
    EXPECT_EQ(later[g].device.segment_allocs, after_first[g].device.segment_allocs) << "device " << g;
    EXPECT_EQ(later[g].pinned.segment_allocs, 1u) << "device " << g;
    EXPECT_GT(later[g].d2h_bytes, 0u);
    EXPECT_EQ(later[g].d2h_bytes, later[g].h2d_bytes);
  }
}

}  // namespace
