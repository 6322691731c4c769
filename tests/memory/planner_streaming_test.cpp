// Parameter streaming in the planner: the price of its copies (streaming_exposed_seconds), and
// param_offload: auto as moves of the search, streaming only the chunks the budget needs and, of
// those that cover the deficit, the cheapest.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "memory/planner.h"
#include "tests/memory/planner_fake.h"

namespace {

using namespace stp::testing;

// Parameter streaming's copy time (streaming_exposed_seconds): both directions of the gradients
// are exposed, the weights only beyond the step's compute (all of them under late parameters);
// nothing without streaming.
TEST(PlannerStreaming, GradientsAreExposedAndWeightsHideUnderCompute) {
  RankPrediction p;
  p.compute_s = 1.0;
  EXPECT_EQ(stp::streaming_exposed_seconds(p, 1000, false), 0.0);  // streaming off adds nothing
  p.stream_weights_up_bytes = 500;
  EXPECT_EQ(stp::streaming_exposed_seconds(p, 1000, false), 0.0);  // 0.5 s of weights under 1 s of compute
  p.stream_grads_up_bytes = 100;
  p.stream_grads_down_bytes = 200;
  EXPECT_DOUBLE_EQ(stp::streaming_exposed_seconds(p, 1000, false), 0.3);
  EXPECT_DOUBLE_EQ(stp::streaming_exposed_seconds(p, 250, false), 300.0 / 250 + (500.0 / 250 - 1.0));
  EXPECT_DOUBLE_EQ(stp::streaming_exposed_seconds(p, 1000, true), 0.3 + 0.5);  // late: no weight hides
}

// More link bandwidth never predicts more exposed time, whatever the bytes and the compute.
TEST(PlannerStreaming, AFasterLinkNeverPredictsMore) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint64_t> bytes(0, 1 << 20);
  std::uniform_real_distribution<double> seconds(0.0, 2e-3);
  for (int trial = 0; trial < 200; ++trial) {
    RankPrediction p;
    p.compute_s = seconds(rng);
    p.stream_weights_up_bytes = bytes(rng);
    p.stream_grads_up_bytes = bytes(rng);
    p.stream_grads_down_bytes = p.stream_grads_up_bytes + bytes(rng);
    double previous = std::numeric_limits<double>::infinity();
    for (double link = 1e8; link <= 1e12; link *= 1.7) {
      const double exposed = stp::streaming_exposed_seconds(p, link, trial % 2 == 1);
      EXPECT_LE(exposed, previous) << "trial " << trial << " link " << link;
      EXPECT_GE(exposed, 0.0);
      previous = exposed;
    }
  }
}

// ---- Streaming per chunk: param_offload auto as moves of the search --------------------------------
// One rank, three chunks of one unit each (no activation levers): the peak is fixed activations plus,
// per chunk, its weights and gradients unless it streams and its optimizer state unless that is on
// the host, plus a working set once any chunk streams.
constexpr std::size_t kStreamWorking = 300;

PlannerInput streaming_problem() {
  PlannerInput in = placement_problem({2000, 1000, 4000});
  in.param_offload = OffloadPolicy::Auto;
  in.evaluate = [&in](std::vector<RankPlan>& plans) {
    RankPrediction p;
    std::size_t peak = kActivations;
    for (std::size_t ch = 0; ch < in.chunk_states[0].size(); ++ch) {
      const stp::ModelStateBytes& b = in.chunk_states[0][ch];
      const bool streamed = plans[0].streams_params(static_cast<int>(ch));
      if (streamed) {
        EXPECT_EQ(plans[0].optimizer_placement(static_cast<int>(ch)), kHost) << "chunk " << ch;
      }
      if (!streamed) peak += b.weights + b.gradients;
      if (plans[0].optimizer_placement(static_cast<int>(ch)) == kDev) peak += b.optimizer;
    }
    if (plans[0].streams_any()) peak += kStreamWorking;
    p.peak_device_bytes = peak;
    p.compute_s = kCompute;
    return std::vector<RankPrediction>{p};
  };
  return in;
}

int streamed_chunks(const stp::MemoryPlan& plan) {
  int n = 0;
  for (std::size_t ch = 0; ch < plan.ranks.at(0).units.size(); ++ch)
    n += plan.ranks[0].streams_params(static_cast<int>(ch));
  return n;
}

TEST(PlannerStreaming, AutoStreamsOnlyTheChunksTheBudgetNeeds) {
  PlannerInput in = streaming_problem();
  // Every state on the device: 5000 + 7000 + 7000 = 19000 B; every optimizer on the host: 12000 B;
  // everything streamed: 5300 B, the minimum.
  in.device_budget = SIZE_MAX;
  stp::MemoryPlan plan = plan_memory(in);
  EXPECT_EQ(streamed_chunks(plan), 0);
  EXPECT_FALSE(plan.optimizer_offload);
  EXPECT_EQ(plan.min_device_budget, kActivations + kStreamWorking);
  // Below that, some chunks stream, not all; the peak fits and is priced.
  for (std::size_t budget : {11000u, 9000u, 7000u}) {
    in.device_budget = budget;
    plan = plan_memory(in);
    SCOPED_TRACE(budget);
    ASSERT_TRUE(plan.feasible);
    EXPECT_LE(plan.predicted[0].peak_device_bytes, budget);
    EXPECT_GT(streamed_chunks(plan), 0);
    EXPECT_LT(streamed_chunks(plan), 3);
    EXPECT_GT(plan.predicted[0].param_stream_s, 0.0);
  }
  // At the minimum every chunk streams; below it nothing fits.
  in.device_budget = kActivations + kStreamWorking;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(streamed_chunks(plan), 3);
  in.device_budget = kActivations + kStreamWorking - 1;
  EXPECT_FALSE(plan_memory(in).feasible);
}

// Of two chunks either of which covers the deficit, the cheaper per byte of it streams: with the
// optimizer on the host already (all), the smallest chunk that covers it. Two microbatches: with
// one, streaming a chunk copies no more than its host optimizer's copies it replaces (gradients
// down once, weights up for F and B), so every chunk's move costs the same negative amount.
TEST(PlannerStreaming, TheCheapestChunkThatCoversTheDeficitStreams) {
  PlannerInput in = streaming_problem();
  in.microbatches = 2;
  in.optimizer_offload = OffloadPolicy::All;
  in.device_budget = 12000 - 600;  // 600 B over: chunk 1 frees 1000 B, less the 300 B working set
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(streamed_chunks(plan), 1);
  EXPECT_TRUE(plan.ranks[0].streams_params(1));
}

}  // namespace
