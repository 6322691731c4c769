// The chunked loss head in training (model.loss_chunk_tokens; docs/memory.md, Chunked loss head):
// the measured peaks equal the plan's, the peak drops by the head records the formula names, auto
// is none while the unchunked plan fits and picks a chunk when it does not, and a step's loss is
// the unchunked one to the bit where the chunks cut the rows where the CPU GEMM's tiles do
// (tests/models/loss_chunk_test.cpp explains the tiles; one BLAS thread per rank here).
#include <gtest/gtest.h>

#include <cstdint>
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

// Every schedule family at tp 2 x pp 2, both head kinds (vocab-parallel and replicated), gpt2 and
// llama, a chunk that does not divide B·T = 32: the measured peak of every device is the plan's.
TEST(LossChunkTraining, MeasuredPeaksEqualThePlan) {
  for (const char* schedule : stp::testing::sweep<const char*>({"stp", "zb-v", "1f1b-i"}, {"zb-v"}))
    for (bool vocab : {true, false})
      for (bool llama : {false, true}) {
        SCOPED_TRACE(std::string(schedule) + (vocab ? " vocab-parallel" : " replicated") + (llama ? " llama" : ""));
        std::vector<std::string> o = {"parallel.tp=2",
                                      "parallel.pp=2",
                                      "model.n_layer=4",
                                      std::string("parallel.schedule=") + schedule,
                                      std::string("parallel.vocab_parallel=") + (vocab ? "true" : "false"),
                                      "model.loss_chunk_tokens=7"};
        if (llama) o = with(o, kLlama);
        TrainRun r = run_training(tiny_config(o), 2);
        ASSERT_EQ(r.plan.ranks.back().loss_chunk_tokens, 7);
        stp::testing::expect_memory_as_planned(r, std::numeric_limits<std::uint64_t>::max());
      }
}

// GPipe on one device holds the head records of every microbatch until the backward starts. Per
// microbatch the unchunked head keeps, besides what both keep (its input x, then dx of the same
// size), the logits (N·V·a), ln_f's output (N·C·a), its mean and rstd and the lse (3 blocks of
// N·4 bytes), each block rounded up to the arena's 256-byte alignment (memory/block_arena.h):
// a = 4 (f32), N = B·T. One microbatch more adds exactly that to the difference of the peaks.
TEST(LossChunkTraining, ThePeakDropsByTheHeadRecordsOfEveryWaitingMicrobatch) {
  const std::int64_t N = 2 * 16, V = 256, C = 32;
  auto block = [](std::int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::int64_t per_microbatch = block(N * V * 4) + block(N * C * 4) + 3 * block(N * 4);
  auto drop = [&](int m) {
    std::vector<std::string> o = {"train.microbatches=" + std::to_string(m)};
    stp::MemoryPlan none = stp::make_memory_plan(tiny_config(with(o, {"model.loss_chunk_tokens=none"})));
    stp::MemoryPlan chunked = stp::make_memory_plan(tiny_config(with(o, {"model.loss_chunk_tokens=8"})));
    return static_cast<std::int64_t>(none.predicted[0].peak_device_bytes) -
           static_cast<std::int64_t>(chunked.predicted[0].peak_device_bytes);
  };
  const std::int64_t d3 = drop(3), d4 = drop(4);
  EXPECT_GT(d3, 0);
  EXPECT_EQ(d4 - d3, per_microbatch);
  std::printf(
      "[ tiny gpipe ] peak drop %lld B at m 3, %lld B at m 4: %lld B per microbatch (logits, ln_f output, 3 x N "
      "floats)\n",
      static_cast<long long>(d3), static_cast<long long>(d4), static_cast<long long>(per_microbatch));
}

// auto: none while the unchunked plan fits (the same plan, so the same bits); over budget, the
// largest chunk of tokens/2, tokens/4, ... whose plan fits. B·T = 16·16 = 256: candidates 128.
TEST(LossChunkTraining, AutoIsNoneWhileThePlanFitsAndChunksWhenItDoesNot) {
  const std::vector<std::string> o = {"train.micro_batch_size=16", "train.microbatches=2"};
  stp::MemoryPlan none = stp::make_memory_plan(tiny_config(with(o, {"model.loss_chunk_tokens=none"})), true);
  stp::MemoryPlan chunked = stp::make_memory_plan(tiny_config(with(o, {"model.loss_chunk_tokens=128"})), true);
  ASSERT_LT(chunked.min_device_budget, none.min_device_budget);
  stp::MemoryPlan fits = stp::make_memory_plan(tiny_config(with(o, {"model.loss_chunk_tokens=auto"})));
  EXPECT_EQ(fits.ranks[0].loss_chunk_tokens, 0);
  const std::size_t between = (chunked.min_device_budget + none.min_device_budget) / 2;
  stp::MemoryPlan tight = stp::make_memory_plan(
      tiny_config(with(o, {"model.loss_chunk_tokens=auto", "memory.device_budget=" + std::to_string(between)})));
  EXPECT_TRUE(tight.feasible);
  EXPECT_EQ(tight.ranks[0].loss_chunk_tokens, 128);
  EXPECT_NE(tight.summary.find("loss head: chunks of 128 tokens"), std::string::npos) << tight.summary;
  TrainRun r = run_training(
      tiny_config(with(o, {"model.loss_chunk_tokens=auto", "memory.device_budget=" + std::to_string(between)})), 1);
  stp::testing::expect_memory_as_planned(r, between);
}

// The first step's loss (the same weights) is the unchunked one to the bit at chunks cut where the
// GEMM's 24-row tiles are (24: rows [0, 24) and [24, 32); 32 and 100: one chunk), for gpt2 and
// llama, tp 2 vocab-parallel and replicated.
TEST(LossChunkTraining, FirstStepLossIsBitwiseAtTileAlignedChunks) {
  for (bool llama : {false, true})
    for (bool vocab : {true, false}) {
      std::vector<std::string> o = {"parallel.tp=2",
                                    std::string("parallel.vocab_parallel=") + (vocab ? "true" : "false")};
      if (llama) o = with(o, kLlama);
      const TrainRun none = run_training(tiny_config(with(o, {"model.loss_chunk_tokens=none"})), 1);
      for (const char* chunk : {"24", "32", "100"}) {
        SCOPED_TRACE(std::string(chunk) + (llama ? " llama" : " gpt2") + (vocab ? " vocab" : ""));
        const TrainRun r = run_training(tiny_config(with(o, {std::string("model.loss_chunk_tokens=") + chunk})), 1);
        EXPECT_EQ(r.losses[0], none.losses[0]);
      }
    }
}

// One chunk of every row (100 >= B·T = 32) runs the head weight's GEMM exactly as the unchunked W
// does, only in F: with an untied head nothing else adds into that gradient, so where a schedule
// runs the head's Ws in the order of its Fs the microbatches' contributions are added in the same
// order and training is bitwise the unchunked run's, losses and parameters, with dp 2 and the
// distributed optimizer, and with the optimizer offloaded to the CPU, too: gpipe, 1f1b, 1f1b-i, zb-h1 and zb-v (Ws
// deferred). A W that added the gradient again, or a gradient reduced before the head's F accumulated it, would show
// here. stp braids the head's W of one microbatch after the F of a later one, so its sum follows another order (the
// first step's loss is still bitwise: FirstStepLossIsBitwiseAtTileAlignedChunks).
TEST(LossChunkTraining, OneChunkTrainsBitwiseWhereWsFollowTheFOrder) {
  for (const char* schedule : stp::testing::sweep<const char*>({"gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-v"}, {"zb-v"}))
    for (const char* dp : {"parallel.dp=1", "parallel.dp=2", "memory.optimizer_offload=all"}) {
      SCOPED_TRACE(std::string(schedule) + " " + dp);
      std::vector<std::string> o =
          with(kLlama, {"parallel.tp=2", "parallel.pp=2", "model.n_layer=4", dp, "parallel.distributed_optimizer=true",
                        std::string("parallel.schedule=") + schedule});
      const TrainRun none = run_training(tiny_config(with(o, {"model.loss_chunk_tokens=none"})), 3);
      const TrainRun one = run_training(tiny_config(with(o, {"model.loss_chunk_tokens=100"})), 3);
      stp::testing::expect_bitwise_equal(one, none);
    }
}

}  // namespace
