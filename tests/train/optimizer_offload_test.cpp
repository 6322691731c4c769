// memory.optimizer_offload (optim/host_update.h) on the CPU backend:
//   * with it on (all), losses, parameters and checkpoints (model and optimizer files, byte for
//     byte) are those of the device optimizer, for every schedule, in f32 and bf16 (the masters
//     on the host: tests/train/host_masters_test.cpp), with the distributed optimizer at dp 2,
//     with gradient clipping on;
//   * a checkpoint taken with it on resumes with it off bitwise as the uninterrupted run, and the
//     reverse;
//   * the non-finite guard skips a step with a planted NaN and leaves everything, the host
//     moments included, bitwise unchanged;
//   * the device peak equals the plan's prediction, and is lower than without it by exactly the
//     optimizer bytes; the moments are on the host, counted in the plan;
//   * a host budget too small for the state is an error naming both numbers, before step 1;
//   * auto keeps the state on the device when that fits, and moves it when it does not.
#include <gtest/gtest.h>

#include <cctype>
#include <regex>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/block_arena.h"
#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/trainer.h"

namespace {

using stp::testing::fresh_dir;
using stp::testing::tiny_config;

using stp::testing::CheckpointedRun;
using stp::testing::train_and_checkpoint;

struct Case {
  const char* schedule;
  bool bf16, distributed;
};

std::vector<std::string> overrides(const Case& c, bool offload) {
  std::vector<std::string> o = {std::string("parallel.schedule=") + c.schedule, "parallel.pp=2",
                                std::string("memory.optimizer_offload=") + (offload ? "all" : "none"),
                                "train.grad_clip=0.05"};  // small enough that clipping scales every step
  if (c.bf16) o.push_back("train.precision=bf16");
  if (c.distributed) {
    o.push_back("parallel.dp=2");
    o.push_back("train.microbatches=4");
    o.push_back("parallel.distributed_optimizer=true");
    o.push_back("parallel.dp_bucket=4KiB");  // several buckets, uneven owned slices
  }
  return o;
}

class OptimizerOffload : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerOffload, IsBitwiseTheDeviceOptimizer) {
  const Case c = GetParam();
  CheckpointedRun device = train_and_checkpoint(overrides(c, false), "optoff_device", 2),
                  host = train_and_checkpoint(overrides(c, true), "optoff_host", 2);
  stp::testing::expect_bitwise_equal(host, device);
  EXPECT_TRUE(host.model_file == device.model_file) << "model.safetensors differs";
  EXPECT_GT(host.optimizer_file.size(), 1000u);
}

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  std::string s = p.param.schedule;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s + (p.param.bf16 ? "_bf16" : "_f32") + (p.param.distributed ? "_dp2_distributed" : "");
}

INSTANTIATE_TEST_SUITE_P(Schedules, OptimizerOffload,
                         ::testing::Values(Case{"gpipe", false, false}, Case{"1f1b", false, false},
                                           Case{"1f1b-i", false, false}, Case{"zb-h1", false, false},
                                           Case{"zb-v", false, false}, Case{"stp", false, false},
                                           Case{"gpipe", true, true}, Case{"1f1b", true, false},
                                           Case{"1f1b-i", false, true}, Case{"zb-h1", true, true},
                                           Case{"zb-v", true, true}, Case{"stp", true, true}, Case{"zb-v", true, false},
                                           Case{"stp", true, false}),
                         case_name);

// Resume across the setting: 2 steps with it on (off), a checkpoint, 2 more with it off (on)
// equal the uninterrupted 4 steps bitwise.
TEST(OptimizerOffloadResume, CheckpointsCrossTheSettingBothWays) {
  stp::testing::expect_resume_crosses_the_setting(
      [](bool on) {
        return std::vector<std::string>{"parallel.schedule=zb-v", "parallel.pp=2",
                                        std::string("memory.optimizer_offload=") + (on ? "all" : "none")};
      },
      "optoff_resume");
}

// The skipped step changes neither the parameters nor the host moments (the optimizer file of a
// checkpoint before and after it is byte for byte the same), with and without the distributed
// optimizer.
TEST(OptimizerOffloadGuard, SkippedStepLeavesTheOffloadedStateUnchanged) {
  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed optimizer" : "replicated optimizer");
    stp::testing::NanGradHook hook(/*rank=*/1, /*step=*/2);
    std::vector<std::string> o = {"parallel.pp=2", "parallel.schedule=stp", "memory.optimizer_offload=all"};
    if (distributed)
      o.insert(o.end(), {"parallel.dp=2", "train.microbatches=4", "parallel.distributed_optimizer=true"});
    stp::Config cfg = tiny_config(o);
    cfg.output.dir = fresh_dir(distributed ? "optoff_guard_dist" : "optoff_guard");
    stp::Trainer t(cfg);
    EXPECT_FALSE(t.step().skipped);
    auto before = t.full_parameters();
    std::string opt_before =
        stp::testing::slurp((std::filesystem::path(t.save_checkpoint()) / "optimizer.safetensors").string());
    stp::StepResult r = t.step();
    EXPECT_TRUE(r.skipped);
    EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), before));
    std::string opt_after =
        stp::testing::slurp((std::filesystem::path(t.save_checkpoint()) / "optimizer.safetensors").string());
    EXPECT_TRUE(opt_after == opt_before) << "the skipped step changed the offloaded moments";
    EXPECT_FALSE(t.step().skipped);
    EXPECT_FALSE(stp::testing::bitwise_equal(t.full_parameters(), before));
  }
}

std::size_t category(const stp::Trainer::DeviceMemory& m, stp::MemoryCategory c) {
  return m.device.by_category[static_cast<std::size_t>(c)];
}

// Measured peak == predicted peak with it on; the peak drops by exactly the device optimizer
// state, which the host now holds (with the staging: 16 bytes per parameter in all).
TEST(OptimizerOffloadMemory, PeakEqualsThePlanAndDropsByTheOptimizerBytes) {
  const std::vector<std::string> base = {"parallel.schedule=stp", "parallel.pp=2", "parallel.tp=2"};
  auto peaks = [&](bool on, std::vector<std::size_t>* optimizer_device, std::vector<std::size_t>* optimizer_host) {
    std::vector<std::string> o = base;
    o.push_back(std::string("memory.optimizer_offload=") + (on ? "all" : "none"));
    stp::Config cfg = tiny_config(o);
    cfg.output.dir = fresh_dir("optoff_memory");
    stp::Trainer t(cfg);
    EXPECT_EQ(t.memory_plan().optimizer_offload, on);
    std::vector<std::size_t> out;
    stp::StepResult r = t.step();
    r = t.step();
    const auto mem = t.device_memory();
    for (std::size_t g = 0; g < r.peak_device_bytes.size(); ++g) {
      const stp::RankPrediction& p = t.memory_plan().predicted.at(g);
      EXPECT_EQ(r.peak_device_bytes[g], p.peak_device_bytes) << "device " << g;
      EXPECT_EQ(category(mem[g], stp::MemoryCategory::OptimizerState), p.optimizer_device_bytes) << "device " << g;
      EXPECT_EQ(mem[g].optimizer_host_bytes, p.optimizer_host_bytes) << "device " << g;
      EXPECT_EQ(category(mem[g], stp::MemoryCategory::Weights), p.weight_bytes) << "device " << g;
      EXPECT_EQ(category(mem[g], stp::MemoryCategory::Gradients), p.grad_bytes) << "device " << g;
      optimizer_device->push_back(category(mem[g], stp::MemoryCategory::OptimizerState));
      optimizer_host->push_back(mem[g].optimizer_host_bytes);
      out.push_back(r.peak_device_bytes[g]);
    }
    return out;
  };
  std::vector<std::size_t> dev_none, host_none, dev_all, host_all;
  auto none = peaks(false, &dev_none, &host_none), all = peaks(true, &dev_all, &host_all);
  ASSERT_EQ(none.size(), all.size());
  for (std::size_t g = 0; g < none.size(); ++g) {
    EXPECT_GT(dev_none[g], 0u);
    EXPECT_EQ(dev_all[g], 0u) << "device " << g;
    EXPECT_EQ(host_none[g], 0u) << "device " << g;
    EXPECT_EQ(none[g] - all[g], dev_none[g]) << "device " << g;
    // Moments plus parameter and gradient staging: twice the moments' bytes, less the device
    // arena's per-block rounding of the moments (the host blocks are exact).
    EXPECT_LE(host_all[g], 2 * dev_none[g]) << "device " << g;
    EXPECT_GT(host_all[g], 2 * dev_none[g] - 2 * dev_none[g] / 20) << "device " << g;
  }
}

TEST(OptimizerOffloadMemory, HostBudgetTooSmallIsAnErrorNamingBothNumbers) {
  stp::Config cfg = tiny_config({"memory.optimizer_offload=all", "memory.host_budget=64KiB"});
  try {
    stp::Trainer t(cfg);
    FAIL() << "expected an error";
  } catch (const stp::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("memory.host_budget = 64.0 KiB"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer"), std::string::npos) << what;
    EXPECT_TRUE(std::regex_search(what, std::regex(R"(needs [0-9.]+ [KMG]?i?B .* [0-9.]+ [KMG]?i?B in all\))")))
        << what;
  }
}

// auto: on the device while the plan fits; on the host once only that fits.
TEST(OptimizerOffloadMemory, AutoMovesTheStateOnlyWhenTheDeviceBudgetNeedsIt) {
  const std::vector<std::string> base = {"parallel.schedule=1f1b", "parallel.pp=2", "memory.optimizer_offload=auto"};
  stp::MemoryPlan roomy = stp::make_memory_plan(tiny_config(base));
  EXPECT_FALSE(roomy.optimizer_offload);
  std::vector<std::string> none = base, all = base;
  none.back() = "memory.optimizer_offload=none";
  all.back() = "memory.optimizer_offload=all";
  stp::MemoryPlan on_device = stp::make_memory_plan(tiny_config(none)),
                  on_host = stp::make_memory_plan(tiny_config(all));
  std::size_t need_device = 0, need_host = 0;
  for (const auto& p : on_device.predicted) need_device = std::max(need_device, p.peak_device_bytes);
  for (const auto& p : on_host.predicted) need_host = std::max(need_host, p.peak_device_bytes);
  ASSERT_LT(need_host, need_device);
  std::vector<std::string> tight = base;
  tight.push_back("memory.device_budget=" + std::to_string(need_host + (need_device - need_host) / 8));
  stp::MemoryPlan plan = stp::make_memory_plan(tiny_config(tight));
  EXPECT_TRUE(plan.optimizer_offload);
  EXPECT_TRUE(plan.feasible);
}

}  // namespace
