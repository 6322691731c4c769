// The tiled unit backward in training (memory.unit_tiles; docs/memory.md, Tiled unit backward):
// the measured peaks equal the plan's (the dry run runs the tiled passes), tiling lowers the peak
// under full recompute, auto is untiled while the untiled plan fits and tiles when it does not, and
// the first step's loss is the untiled one to the bit (F is not tiled; the gradients' numerics are
// tests/models/unit_tiles_test.cpp's).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"

namespace {

using stp::testing::kLlama;
using stp::testing::run_training;
using stp::testing::tiny_config;
using stp::testing::TrainRun;
using stp::testing::with;

// stp, zb-v and 1f1b-i at tp 2 x pp 2, gpt2 and llama, with full recompute alone and with every
// lever (activation, optimizer and parameter offload): every device's measured peak is the plan's.
TEST(UnitTilesTraining, MeasuredPeaksEqualThePlan) {
  for (const char* schedule : stp::testing::sweep<const char*>({"stp", "zb-v", "1f1b-i"}, {"zb-v"}))
    for (bool llama : {false, true})
      for (bool every_lever : {false, true}) {
        SCOPED_TRACE(std::string(schedule) + (llama ? " llama" : " gpt2") + (every_lever ? " every lever" : ""));
        std::vector<std::string> o = {"parallel.tp=2",         "parallel.pp=2",
                                      "model.n_layer=4",       std::string("parallel.schedule=") + schedule,
                                      "memory.recompute=full", "memory.unit_tiles=2"};
        if (llama) o = with(o, kLlama);
        if (every_lever)
          o = with(o, {"memory.offload=all", "memory.optimizer_offload=all", "memory.param_offload=all"});
        TrainRun r = run_training(tiny_config(o), 2);
        ASSERT_EQ(r.plan.ranks.back().unit_tiles, 2);
        stp::testing::expect_memory_as_planned(r, std::numeric_limits<std::uint64_t>::max());
      }
}

// A tiled unit's W runs in its B, so a deferred W(u) is empty and parameter streaming moves nothing
// for it (Stage::pass_grads names no gradient for that W, and a W pass moves no weights): the tiled
// B moves the gradients its W would have, so under zb-v (deferred Ws) and 1f1b (fused) a step streams exactly the bytes
// of the untiled step, each way, on every device (an empty W that moved its gradients would add a
// round trip), and trains bitwise like the same tiled run without streaming, with the measured
// peaks the plan's.
TEST(UnitTilesTraining, AnEmptyWeightPassStreamsNothing) {
  const std::vector<std::string> base = {"parallel.tp=2",
                                         "parallel.pp=2",
                                         "model.n_layer=4",
                                         "memory.recompute=full",
                                         "model.loss_chunk_tokens=none",
                                         "memory.optimizer_offload=all"};
  for (const char* schedule : {"zb-v", "1f1b"}) {
    SCOPED_TRACE(schedule);
    const std::vector<std::string> o =
        with(base, {std::string("parallel.schedule=") + schedule, "memory.param_offload=all"});
    const stp::MemoryPlan one = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=1"})));
    const stp::MemoryPlan two = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=2"})));
    ASSERT_EQ(one.predicted.size(), two.predicted.size());
    for (std::size_t g = 0; g < one.predicted.size(); ++g) {
      const stp::RankPrediction &a = one.predicted[g], &b = two.predicted[g];
      EXPECT_GT(b.stream_grads_down_bytes, 0u) << "device " << g;
      EXPECT_EQ(b.stream_weights_up_bytes, a.stream_weights_up_bytes) << "device " << g;
      EXPECT_EQ(b.stream_grads_up_bytes, a.stream_grads_up_bytes) << "device " << g;
      EXPECT_EQ(b.stream_grads_down_bytes, a.stream_grads_down_bytes) << "device " << g;
      std::printf("[ %s device %zu ] streamed per step %llu B untiled, %llu B in 2 sequence groups\n", schedule, g,
                  static_cast<unsigned long long>(a.stream_weights_up_bytes + a.stream_grads_up_bytes +
                                                  a.stream_grads_down_bytes),
                  static_cast<unsigned long long>(b.stream_weights_up_bytes + b.stream_grads_up_bytes +
                                                  b.stream_grads_down_bytes));
    }
  }
  const std::vector<std::string> tiled = with(base, {"parallel.schedule=zb-v", "memory.unit_tiles=2"});
  const TrainRun streamed = run_training(tiny_config(with(tiled, {"memory.param_offload=all"})), 2);
  stp::testing::expect_memory_as_planned(streamed, std::numeric_limits<std::uint64_t>::max());
  stp::testing::expect_bitwise_equal(streamed,
                                     run_training(tiny_config(with(tiled, {"memory.param_offload=none"})), 2));
}

// Under full recompute a unit's backward is what B holds at the peak of one device running the
// whole model: two groups of one sequence hold less of it than one group of two.
TEST(UnitTilesTraining, TilingLowersThePeakUnderFullRecompute) {
  for (bool llama : {false, true}) {
    std::vector<std::string> o = {"memory.recompute=full", "model.loss_chunk_tokens=8"};
    if (llama) o = with(o, kLlama);
    const stp::MemoryPlan one = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=1"})));
    const stp::MemoryPlan two = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=2"})));
    EXPECT_LT(two.predicted[0].peak_device_bytes, one.predicted[0].peak_device_bytes) << (llama ? "llama" : "gpt2");
    std::printf("[ tiny%s 1 device, recompute full ] peak %zu B untiled, %zu B in 2 sequence groups\n",
                llama ? " llama" : "", one.predicted[0].peak_device_bytes, two.predicted[0].peak_device_bytes);
  }
}

// auto (the default): untiled while the untiled plan fits (the same plan, so the same bits); over
// budget, the fewest tiles whose plan fits. micro_batch_size 4: candidates 2, 4.
TEST(UnitTilesTraining, AutoIsUntiledWhileThePlanFitsAndTilesWhenItDoesNot) {
  const std::vector<std::string> o = {"train.micro_batch_size=4", "train.microbatches=2", "memory.recompute=full",
                                      "model.loss_chunk_tokens=none"};
  const stp::MemoryPlan one = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=1"})), true);
  const stp::MemoryPlan two = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=2"})), true);
  const stp::MemoryPlan four = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=4"})), true);
  ASSERT_LT(two.min_device_budget, one.min_device_budget);
  ASSERT_LE(four.min_device_budget, two.min_device_budget);
  const stp::MemoryPlan fits = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=auto"})), true);
  EXPECT_EQ(fits.ranks[0].unit_tiles, 1);
  EXPECT_EQ(fits.min_device_budget, four.min_device_budget) << "auto's minimum is the most tiles'";
  const std::string between =
      "memory.device_budget=" + std::to_string((two.min_device_budget + one.min_device_budget) / 2);
  const stp::MemoryPlan tight = stp::make_memory_plan(tiny_config(with(o, {"memory.unit_tiles=auto", between})));
  EXPECT_TRUE(tight.feasible);
  EXPECT_EQ(tight.ranks[0].unit_tiles, 2);
  EXPECT_NE(tight.summary.find("unit backward: 2 sequence groups"), std::string::npos) << tight.summary;
  const TrainRun r = run_training(tiny_config(with(o, {"memory.unit_tiles=auto", between})), 1);
  stp::testing::expect_memory_as_planned(r, (two.min_device_budget + one.min_device_budget) / 2);
  const TrainRun untiled = run_training(tiny_config(with(o, {"memory.unit_tiles=1"})), 1);
  EXPECT_EQ(r.losses[0], untiled.losses[0]) << "F is not tiled";
  // auto is the default: the plan that fits untiled is auto's (so 1's), and a budget only the tiled
  // plans fit is planned tiled instead of failing.
  const stp::MemoryPlan by_default = stp::make_memory_plan(tiny_config(o), true);
  EXPECT_EQ(by_default.ranks[0].unit_tiles, 1);
  EXPECT_EQ(by_default.min_device_budget, four.min_device_budget);
  EXPECT_EQ(by_default.summary, fits.summary);
  const stp::MemoryPlan tight_by_default = stp::make_memory_plan(tiny_config(with(o, {between})));
  EXPECT_TRUE(tight_by_default.feasible);
  EXPECT_EQ(tight_by_default.ranks[0].unit_tiles, 2);
}

}  // namespace
