// bf16 mixed precision (train.precision: bf16) on the CPU backend, which emulates it bit for bit
// (docs/model.md, "Precision"): activations and GEMM operands are bf16, master weights, optimizer
// state, reductions and the residual stream are f32.
//
//   * Against f32 training: the difference is the rounding of activations and weight copies to
//     8 significant bits (relative error <= 2^-9 per rounding). Losses are means over all tokens,
//     so the per-token errors average out: measured |Δloss| / loss ~ 1e-5 over three steps;
//     asserted below 2e-3 (one bf16 rounding), which a wrong kernel (an unrounded store read as
//     bf16, a mis-typed GEMM, a stale weight copy) exceeds by orders of magnitude. Parameters are
//     not compared: AdamW's first steps move an entry by ~lr in the direction of its gradient's
//     sign whatever its size, so an entry whose gradient is near zero flips under any rounding
//     (one such entry of a zero-initialised bias is a 17% normwise difference). Gradients are
//     checked against PyTorch in tests/models/gpt2_reference_test.cpp.
//   * Against bf16 single-rank training, every TP x PP layout: TP splits the column-parallel
//     GEMMs, and a different association of an f32 sum can round to the neighbouring bf16 value.
//     Asserted: first-step loss bitwise with tp = 1 (the same forward math), relative 1e-3 else.
//   * The memory levers (offload, recompute, the planner's mix) stay bitwise neutral in bf16 and
//     the planner's predicted peak equals the measured one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

using stp::testing::TrainRun;

TrainRun train(const std::vector<std::string>& overrides) {
  return stp::testing::run_training(tiny_config(overrides), 3);
}

const TrainRun& bf16_single() {
  static const TrainRun r = train({"train.precision=bf16"});
  return r;
}

TEST(Bf16, TracksF32TrainingWithinRoundingError) {
  const TrainRun f32 = train({});
  const TrainRun& bf = bf16_single();
  double worst_loss = 0;
  for (std::size_t i = 0; i < f32.losses.size(); ++i) {
    double rel = std::fabs(bf.losses[i] - f32.losses[i]) / f32.losses[i];
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LT(rel, 2e-3) << "step " << i + 1 << ": bf16 " << bf.losses[i] << " f32 " << f32.losses[i];
  }
  // Not the same run: bf16 must actually round something.
  EXPECT_FALSE(stp::testing::bitwise_equal(bf.params, f32.params));
  EXPECT_LT(bf.peaks[0], f32.peaks[0]) << "bf16 activations take half the bytes";
  std::printf("[ bf16 vs f32 ] loss rel %.2e, peak %llu vs %llu bytes\n", worst_loss,
              static_cast<unsigned long long>(bf.peaks[0]), static_cast<unsigned long long>(f32.peaks[0]));
}

struct Layout {
  const char* schedule;
  int tp, pp;
  int dp = 1;
};

class Bf16Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(Bf16Layouts, MatchSingleRankBf16) {
  const Layout l = GetParam();
  TrainRun run = train({"train.precision=bf16", std::string("parallel.schedule=") + l.schedule,
                        "parallel.tp=" + std::to_string(l.tp), "parallel.pp=" + std::to_string(l.pp)});
  const TrainRun& ref = bf16_single();
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-3 * ref.losses[i]) << "step " << i + 1;
  if (l.tp == 1) {
    EXPECT_EQ(run.losses[0], ref.losses[0]) << "the first step's forward is the same math";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Bf16Layouts,
                         ::testing::Values(Layout{"stp", 2, 2}, Layout{"zb-v", 1, 2}, Layout{"1f1b-i", 2, 2},
                                           Layout{"gpipe", 1, 4}),
                         stp::testing::layout_case_name<Layout>);

TEST(Bf16, MemoryLeversAreBitwiseNeutralAndThePlanIsExact) {
  const std::vector<std::string> base = {"train.precision=bf16", "parallel.schedule=stp", "parallel.tp=2",
                                         "parallel.pp=2", "model.n_layer=4"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return train(more);
  };
  const TrainRun keep = with({});
  std::vector<std::string> planned = base;
  planned.insert(planned.end(), {"memory.offload=auto", "memory.recompute=auto"});
  const std::size_t minimum = stp::make_memory_plan(tiny_config(planned), true).min_device_budget;
  const std::size_t budget = (keep.peaks[0] + minimum) / 2;
  for (std::vector<std::string> lever : std::vector<std::vector<std::string>>{
           {"memory.offload=all"},
           {"memory.recompute=full"},
           {"memory.recompute=selective"},
           {"memory.offload=auto", "memory.recompute=auto", "memory.device_budget=" + std::to_string(budget)}}) {
    SCOPED_TRACE(lever.back());
    TrainRun r = with(lever);
    stp::testing::expect_bitwise_equal(r, keep);
    EXPECT_LT(r.peaks[0], keep.peaks[0]) << "the lever saved nothing";
    if (lever.size() > 1) stp::testing::expect_memory_as_planned(r, budget);  // bf16 peaks predicted exactly
  }
}

}  // namespace
