// The planner's last levers on analytic fakes (late_reload_problem, tests/memory/planner_fake.h):
// late reloads only once no unit move is left, late parameters only once late reloads are not
// enough, each priced as the copies it exposes; neither without what it moves.
#include <gtest/gtest.h>

#include <string>

#include "memory/planner.h"
#include "tests/memory/planner_fake.h"

namespace {

using namespace stp::testing;

TEST(PlannerLateReloads, OnlyWhenNoUnitMoveIsLeft) {
  PlannerInput in = late_reload_problem();
  const std::size_t states = kWeights + kGradients + kOptimizer + kBuffers;
  // Both units offloaded, one set back early, fits: no late reloads.
  in.device_budget = states + kSet;
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_FALSE(plan.ranks[0].late_reloads);
  EXPECT_EQ(plan.predicted[0].exposed_copy_s, 0.0);
  // One byte less: only late reloads fit, and they are priced.
  in.device_budget = states + kSet - 1;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(plan.ranks[0].late_reloads);
  EXPECT_TRUE(plan.ranks[0].units[0][0].offload && plan.ranks[0].units[0][1].offload);
  EXPECT_LE(plan.predicted[0].peak_device_bytes, in.device_budget);
  EXPECT_GT(plan.predicted[0].exposed_copy_s, 0.0);
  EXPECT_NE(plan.summary.find("late reloads"), std::string::npos) << plan.summary;
  // The strongest plan reloads late: the minimum is the states alone.
  EXPECT_EQ(plan.min_device_budget, states);
  in.device_budget = states - 1;
  EXPECT_FALSE(plan_memory(in).feasible);
}

TEST(PlannerLateReloads, NeverWithoutOffload) {
  PlannerInput in = late_reload_problem();
  in.offload = OffloadPolicy::None;
  in.device_budget = SIZE_MAX;
  stp::MemoryPlan plan = plan_memory(in);
  EXPECT_FALSE(plan.ranks[0].late_reloads);
  EXPECT_EQ(plan.min_device_budget, kWeights + kGradients + kOptimizer + kBuffers + 2 * kSet);
}

// ---- Late parameters: the last lever of all ------------------------------------------------------
// The late-reload fake with every chunk streamed (param_offload: all): the device holds a working
// set of the streamed states, plus the next unit's weights prefetched during a pass unless the rank
// takes late parameters, which frees them and exposes every weight copy (param_stream_seconds).
constexpr std::size_t kWorking = 700, kPrefetched = 250;

PlannerInput late_params_problem() {
  PlannerInput in = late_reload_problem();
  in.param_offload = OffloadPolicy::All;
  in.optimizer_offload = OffloadPolicy::All;
  in.evaluate = [&in](std::vector<RankPlan>& plans) {
    RankPrediction p;
    std::size_t kept = 0, copied = 0;
    for (const stp::UnitPlan& u : plans[0].units[0]) (u.offload ? copied : kept) += kSet;
    const std::size_t early = copied > 0 && !plans[0].late_reloads ? kSet : 0;
    const bool streamed = plans[0].streams_params(0);
    const std::size_t states = streamed ? kWorking + (plans[0].late_params ? 0 : kPrefetched) : kWeights + kGradients;
    p.peak_device_bytes = states + kBuffers + kept + early;
    p.offload_bytes_per_step = copied;
    p.compute_s = kCompute;
    if (plans[0].late_reloads) p.exposed_copy_s = static_cast<double>(copied) / in.link_bytes_per_s;
    return std::vector<RankPrediction>{p};
  };
  return in;
}

TEST(PlannerLateParams, OnlyOnceLateReloadsAreNotEnough) {
  PlannerInput in = late_params_problem();
  const std::size_t base = kWorking + kBuffers;
  // Prefetch and an early set fit: neither late lever.
  in.device_budget = base + kPrefetched + kSet;
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(plan.ranks[0].streams_params(0));
  EXPECT_FALSE(plan.ranks[0].late_reloads);
  EXPECT_FALSE(plan.ranks[0].late_params);
  const double prefetched_s = plan.predicted[0].param_stream_s;
  // Late reloads alone fit: no late parameters.
  in.device_budget = base + kPrefetched;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(plan.ranks[0].late_reloads);
  EXPECT_FALSE(plan.ranks[0].late_params);
  EXPECT_EQ(plan.summary.find("late parameters"), std::string::npos) << plan.summary;
  // One byte less: late parameters too, priced as every weight copy exposed.
  in.device_budget = base + kPrefetched - 1;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(plan.ranks[0].late_reloads);
  EXPECT_TRUE(plan.ranks[0].late_params);
  EXPECT_LE(plan.predicted[0].peak_device_bytes, in.device_budget);
  EXPECT_NE(plan.summary.find("rank 0: late parameters"), std::string::npos) << plan.summary;
  const stp::ModelStateBytes& chunk = in.chunk_states[0][0];
  EXPECT_DOUBLE_EQ(plan.predicted[0].param_stream_s, stp::param_stream_seconds(in, chunk, kCompute, true));
  EXPECT_GT(plan.predicted[0].param_stream_s, prefetched_s);
  // The strongest plan takes both: the minimum is the working set and the buffers.
  EXPECT_EQ(plan.min_device_budget, base);
  in.device_budget = base - 1;
  EXPECT_FALSE(plan_memory(in).feasible);
}

// Without streaming there is nothing to take late; with streaming but no activation offload, late
// parameters are the first late lever.
TEST(PlannerLateParams, NeverWithoutStreaming) {
  PlannerInput in = late_params_problem();
  in.param_offload = OffloadPolicy::None;
  in.device_budget = SIZE_MAX;
  stp::MemoryPlan plan = plan_memory(in);
  EXPECT_FALSE(plan.ranks[0].late_params);
  EXPECT_FALSE(plan.ranks[0].streams_params(0));
  EXPECT_EQ(plan.predicted[0].param_stream_s, 0.0);
  in = late_params_problem();
  in.offload = OffloadPolicy::None;
  in.device_budget = kWorking + kBuffers + 2 * kSet;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_FALSE(plan.ranks[0].late_reloads);
  EXPECT_TRUE(plan.ranks[0].late_params);
}

// The price of a streamed chunk: the gradients' copies (down every microbatch, up all but the
// first) always, the weight copies beyond the compute that hides them (all of them when late).
TEST(PlannerLateParams, StreamingPriceHidesPrefetchedWeightsUnderCompute) {
  PlannerInput in = late_params_problem();
  in.microbatches = 2;
  in.link_bytes_per_s = 1e3;
  const stp::ModelStateBytes chunk{100, 50, 200};
  const double grads = (2 * 2 - 1) * 50 / 1e3, weights = 2 * 2 * 100 / 1e3;  // 0.15 s and 0.4 s
  EXPECT_DOUBLE_EQ(stp::param_stream_seconds(in, chunk, 0.0, false), grads + weights);
  EXPECT_DOUBLE_EQ(stp::param_stream_seconds(in, chunk, 0.25, false), grads + weights - 0.25);
  EXPECT_DOUBLE_EQ(stp::param_stream_seconds(in, chunk, 5.0, false), grads);
  EXPECT_DOUBLE_EQ(stp::param_stream_seconds(in, chunk, 5.0, true), grads + weights);
}

}  // namespace
