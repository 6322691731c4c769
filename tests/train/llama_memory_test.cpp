// The memory levers for Llama-family models, as memory_plan_test.cpp checks them for GPT-2:
// offload, recompute and the planner's mix train bitwise like keeping everything, and the
// planner's predicted peaks equal the measured ones within the budget. Grouped-query attention
// with q/k/v biases and an untied head (fused attention), and a tied head (naive attention).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;
using stp::testing::TrainRun;

const std::vector<std::vector<std::string>>& variants() {
  static const std::vector<std::vector<std::string>> v = {
      {"model.qkv_bias=true", "model.tie_embeddings=false", "model.attention=fused"},
      {"model.tie_embeddings=true", "model.attention=naive"}};
  return v;
}

std::vector<std::string> llama(const std::vector<std::string>& variant, std::vector<std::string> more) {
  std::vector<std::string> out = {"model.arch=llama", "model.n_kv_head=2", "model.intermediate_size=64",
                                  "model.n_layer=4",  "parallel.tp=2",     "parallel.pp=2"};
  out.insert(out.end(), variant.begin(), variant.end());
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

TrainRun train(const std::vector<std::string>& overrides, int steps = 3) {
  return stp::testing::run_training(tiny_config(overrides), steps);
}

// Under a sanitizer: one schedule per variant (stp with the first, 1f1b-i with the second).
TEST(LlamaMemoryLevers, OffloadRecomputeAndThePlannerTrainBitwiseLikeKeepingEverything) {
  for (std::size_t v = 0; v < variants().size(); ++v) {
    const auto& variant = variants()[v];
    SCOPED_TRACE(variant.back());
    for (const char* schedule : stp::testing::sweep<const char*>({"stp", "1f1b-i"}, {v == 0 ? "stp" : "1f1b-i"})) {
      SCOPED_TRACE(schedule);
      stp::testing::expect_memory_levers_neutral([](auto o, int steps) { return train(o, steps); },
                                                 llama(variant, {std::string("parallel.schedule=") + schedule}), 3,
                                                 /*as_planned=*/false);
    }
  }
}

// Under a sanitizer: the tightest budget only.
TEST(LlamaMemoryPlanner, PredictedPeaksEqualMeasuredPeaksWithinEveryBudget) {
  for (const auto& variant : variants()) {
    SCOPED_TRACE(variant.back());
    const std::vector<std::string> base =
        llama(variant, {"parallel.schedule=stp", "memory.offload=auto", "memory.recompute=auto"});
    TrainRun keep = train(base, 2);
    stp::MemoryPlan exact = stp::make_memory_plan(tiny_config(base), /*exact_minimum=*/true);
    ASSERT_TRUE(exact.min_budget_exact);
    std::size_t minimum = exact.min_device_budget;
    ASSERT_LT(minimum, keep.peaks[0]);
    for (std::size_t budget :
         stp::testing::sweep<std::size_t>({keep.peaks[0] * 2, (keep.peaks[0] + minimum) / 2, minimum}, {minimum})) {
      SCOPED_TRACE(budget);
      std::vector<std::string> o = base;
      o.push_back("memory.device_budget=" + std::to_string(budget));
      TrainRun r = train(o, 2);
      stp::testing::expect_memory_as_planned(r, budget);
    }
  }
}

}  // namespace
