// model.attention end to end on the CPU backend: fused attention trains like the naive reference
// (losses within 1e-5 relative), every memory lever stays bitwise neutral under either kernel and
// the planner's peaks equal the measured ones, and fused attention's records are smaller.
//
// Why 1e-5 holds: the two kernels compute the same function and differ by f32 rounding only
// (tests/core/fused_attention_test.cpp: each within ~1e-7 of float64 on these sizes); over a few
// AdamW steps at lr 1e-3 these differences move the loss by far less (measured below, printed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "config/config.h"
#include "train/memory_planning.h"

namespace {

using stp::testing::tiny_config;
using stp::testing::TrainRun;

TrainRun train(std::vector<std::string> overrides, int steps) {
  return stp::testing::run_training(tiny_config(overrides), steps);
}

// 10 steps of the test config per layout (20 steps of configs/tiny.yaml are the benchmark
// command in docs/model.md, Attention; they take minutes on 2 cores).
TEST(AttentionKernels, FusedTrainsLikeNaiveWithin1e5Relative) {
  for (std::vector<std::string> layout : std::vector<std::vector<std::string>>{
           {"parallel.tp=1", "parallel.pp=1", "parallel.schedule=gpipe"},
           {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", "parallel.schedule=stp"}}) {
    SCOPED_TRACE(layout[0] + " " + layout[1]);
    std::vector<std::string> fused = layout, naive = layout;
    fused.push_back("model.attention=fused");
    naive.push_back("model.attention=naive");
    const TrainRun f = train(fused, 10), n = train(naive, 10);
    double worst = 0;
    for (std::size_t i = 0; i < n.losses.size(); ++i) {
      EXPECT_NEAR(f.losses[i], n.losses[i], 1e-5 * n.losses[i]) << "step " << i + 1;
      worst = std::max(worst, std::fabs(f.losses[i] - n.losses[i]) / n.losses[i]);
    }
    std::printf("[ fused vs naive ] %s %s: %zu steps, loss %.6f -> %.6f, largest relative loss difference %.2e\n",
                layout[0].c_str(), layout[1].c_str(), n.losses.size(), n.losses.front(), n.losses.back(), worst);
    EXPECT_LT(f.peaks[0], n.peaks[0]) << "fused attention kept as much as naive";
  }
}

// The levers with each kernel (the other memory tests run the default, fused): offload, recompute
// (selective and full) and the planner's mix train bitwise like keeping everything, and the
// measured peaks equal the plan's. Under a sanitizer: naive only (MemoryLevers runs the levers
// with fused).
TEST(AttentionKernels, LeversBitwiseNeutralAndPeaksAsPlannedUnderEitherKernel) {
  for (const char* kernel : stp::testing::sweep<const char*>({"model.attention=fused", "model.attention=naive"},
                                                             {"model.attention=naive"})) {
    SCOPED_TRACE(kernel);
    const std::vector<std::string> base = {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", "parallel.schedule=stp",
                                           kernel};
    stp::testing::expect_memory_levers_neutral(train, base, 2, /*as_planned=*/true);
  }
}

// configs/long-context.yaml (T = 4096): its budget holds a plan with fused attention and none with
// naive attention, whose probabilities alone exceed it (docs/memory.md, Long context). Plans are
// dry runs: no step is trained.
TEST(AttentionKernels, LongContextConfigFitsOnlyWithFusedAttention) {
  stp::Config c = stp::load_config(std::string(STP_SOURCE_DIR) + "/configs/long-context.yaml");
  ASSERT_EQ(c.model.attention, "fused");
  ASSERT_EQ(c.model.seq_len, 4096);
  const stp::MemoryPlan fused = stp::make_memory_plan(c);
  EXPECT_TRUE(fused.feasible) << fused.summary;
  ASSERT_EQ(fused.predicted.size(), 1u);
  EXPECT_LE(fused.predicted[0].peak_device_bytes, fused.device_budget);
  c.model.attention = "naive";
  const stp::MemoryPlan naive = stp::make_memory_plan(c);
  EXPECT_FALSE(naive.feasible);
  EXPECT_GT(naive.min_device_budget, 4 * fused.min_device_budget);
  std::printf("[ long context ] budget %zu B; minimum feasible: fused %zu B, naive %zu B\n", fused.device_budget,
              fused.min_device_budget, naive.min_device_budget);
}

}  // namespace
