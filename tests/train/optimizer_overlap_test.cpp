// memory.optimizer_overlap (optim/host_update.h, Speculation) on the CPU backend: the CPU AdamW of
// an offloaded chunk whose gradients are final early runs during the backward, as a speculation
// on the clip coefficient being 1 and the step not being skipped. Against memory.optimizer_overlap:
// none, bitwise (losses, parameters, both checkpoint files), for stp and zb-v at pp 2, f32 and bf16
// (host masters), and dp 2 with the distributed optimizer and replicated (speculating once a chunk's
// reduction has landed):
//   * clipping inactive (the maximum norm far above the norm): every speculation commits;
//   * clipping active (coefficient < 1 every step): every speculation is discarded and the update
//     redone from the kept state;
//   * mixed, with a skipped step in the middle (the non-finite guard's NaN hook): some steps
//     commit, some discard, and the skipped step's speculations are dropped;
// a checkpoint resumes across the setting bitwise both ways; and the pinned host memory, shadows
// included, is the plan's to the byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::CheckpointedRun;
using stp::testing::fresh_dir;
using stp::testing::tiny_config;

struct Case {
  const char* schedule;
  bool bf16, distributed, dp2 = false;  // distributed: dp 2 with the distributed optimizer
};

std::vector<std::string> overrides(const Case& c, bool overlap, double grad_clip) {
  std::vector<std::string> o = {std::string("parallel.schedule=") + c.schedule, "parallel.pp=2",
                                "memory.optimizer_offload=all",
                                std::string("memory.optimizer_overlap=") + (overlap ? "all" : "none"),
                                "train.grad_clip=" + std::to_string(grad_clip)};
  if (c.bf16) o.push_back("train.precision=bf16");
  if (c.distributed || c.dp2) o.insert(o.end(), {"parallel.dp=2", "train.microbatches=4", "parallel.dp_bucket=4KiB"});
  if (c.distributed) o.push_back("parallel.distributed_optimizer=true");
  return o;
}

struct OverlapRun {
  CheckpointedRun run;
  std::vector<stp::StepResult> steps;
};

// `steps` steps, then a checkpoint; with `skip` > 0 a NaN gradient on rank 1 at that step.
OverlapRun train(const std::vector<std::string>& o, const std::string& dir, int steps, int skip) {
  std::unique_ptr<stp::testing::NanGradHook> hook;
  if (skip > 0) hook = std::make_unique<stp::testing::NanGradHook>(/*rank=*/1, skip);
  stp::Config cfg = tiny_config(o);
  cfg.output.dir = fresh_dir(dir);
  stp::Trainer t(cfg);
  OverlapRun out;
  for (int i = 0; i < steps; ++i) {
    out.steps.push_back(t.step());
    out.run.losses.push_back(out.steps.back().loss);
  }
  out.run.params = t.full_parameters();
  const std::filesystem::path ck = t.save_checkpoint();
  out.run.model_file = stp::testing::slurp((ck / "model.safetensors").string());
  out.run.optimizer_file = stp::testing::slurp((ck / "optimizer.safetensors").string());
  return out;
}

void expect_same(const OverlapRun& overlap, const OverlapRun& none) {
  stp::testing::expect_bitwise_equal(overlap.run, none.run);
  EXPECT_TRUE(overlap.run.model_file == none.run.model_file) << "model.safetensors differs";
  for (const stp::StepResult& r : none.steps)
    EXPECT_EQ(r.speculation.committed + r.speculation.discarded, 0u) << "step " << r.step << " speculated without it";
}

class OptimizerOverlap : public ::testing::TestWithParam<Case> {};

// Three steps at maximum norm grad_clip with overlap none and all (in dir + "_none", dir + "_all"):
// bitwise, and in every step of overlap all either the clip coefficient is 1 and every speculation
// commits (`commits`), or it is below 1 and every speculation is discarded.
void expect_bitwise_speculation(const Case& c, double grad_clip, const std::string& dir, bool commits) {
  const OverlapRun none = train(overrides(c, false, grad_clip), dir + "_none", 3, 0);
  const OverlapRun all = train(overrides(c, true, grad_clip), dir + "_all", 3, 0);
  expect_same(all, none);
  for (const stp::StepResult& r : all.steps) {
    if (commits) {
      EXPECT_EQ(r.clip_coef, 1.0) << "step " << r.step;
      EXPECT_GT(r.speculation.committed, 0u) << "step " << r.step;
      EXPECT_EQ(r.speculation.discarded, 0u) << "step " << r.step;
    } else {
      EXPECT_LT(r.clip_coef, 1.0) << "step " << r.step;
      EXPECT_EQ(r.speculation.committed, 0u) << "step " << r.step;
      EXPECT_GT(r.speculation.discarded, 0u) << "step " << r.step;
    }
  }
}

TEST_P(OptimizerOverlap, CommitsWhenClippingIsInactiveAndIsBitwise) {
  expect_bitwise_speculation(GetParam(), 1e9, "ovl_commit", /*commits=*/true);
}

TEST_P(OptimizerOverlap, DiscardsWhenClippingScalesAndIsBitwise) {
  expect_bitwise_speculation(GetParam(), 0.05, "ovl_discard", /*commits=*/false);
}

// A maximum norm between the norms of the unclipped run's steps, so that some steps clip and some
// do not; step 2 is skipped.
TEST_P(OptimizerOverlap, MixedStepsAndASkippedStepAreBitwise) {
  const Case c = GetParam();
  const OverlapRun probe = train(overrides(c, false, 1e9), "ovl_mixed_probe", 5, 0);
  std::vector<double> norms;
  for (const stp::StepResult& r : probe.steps) norms.push_back(r.grad_norm);
  std::sort(norms.begin(), norms.end());
  const double max_norm = (norms[1] + norms[3]) / 2;
  const OverlapRun none = train(overrides(c, false, max_norm), "ovl_mixed_none", 5, 2);
  const OverlapRun all = train(overrides(c, true, max_norm), "ovl_mixed_all", 5, 2);
  expect_same(all, none);
  std::uint64_t committed = 0, discarded = 0;
  for (const stp::StepResult& r : all.steps) {
    EXPECT_EQ(r.skipped, r.step == 2) << "step " << r.step;
    if (r.skipped) {
      EXPECT_EQ(r.speculation.committed + r.speculation.discarded, 0u);
    }
    committed += r.speculation.committed;
    discarded += r.speculation.discarded;
  }
  EXPECT_GT(committed, 0u) << "no step committed: the maximum norm " << max_norm << " clipped every step";
  EXPECT_GT(discarded, 0u) << "no step discarded: the maximum norm " << max_norm << " clipped no step";
}

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  std::string s = p.param.schedule;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s + (p.param.bf16 ? "_bf16" : "_f32") + (p.param.distributed ? "_dp2_distributed" : "") +
         (p.param.dp2 ? "_dp2_replicated" : "");
}

INSTANTIATE_TEST_SUITE_P(Schedules, OptimizerOverlap,
                         ::testing::Values(Case{"stp", false, false}, Case{"stp", true, false},
                                           Case{"zb-v", false, false}, Case{"zb-v", true, false},
                                           Case{"stp", true, true}, Case{"zb-v", false, true},
                                           Case{"stp", false, false, true}),
                         case_name);

// Resume across the setting: 2 steps with it on (off), a checkpoint, 2 more with it off (on) equal
// the uninterrupted 4 steps bitwise (committing speculations, so the commits are what is saved).
TEST(OptimizerOverlapResume, CheckpointsCrossTheSettingBothWays) {
  stp::testing::expect_resume_crosses_the_setting(
      [](bool on) {
        return std::vector<std::string>{"parallel.schedule=stp", "parallel.pp=2", "memory.optimizer_offload=all",
                                        "train.grad_clip=1e9",
                                        std::string("memory.optimizer_overlap=") + (on ? "all" : "none")};
      },
      "ovl_resume");
}

// all where nothing can speculate (the optimizer on the device) says so; where something does, no
// warning.
TEST(OptimizerOverlapWarning, AllWithNothingToSpeculateWarns) {
  auto warned = [](const std::vector<std::string>& o) {
    stp::Config cfg = tiny_config(o);
    cfg.output.dir = fresh_dir("ovl_warning");
    const stp::Trainer t(cfg);
    for (const std::string& w : t.warnings())
      if (w.find("memory.optimizer_overlap: all does nothing") != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(warned({"parallel.pp=2", "memory.optimizer_overlap=all"}));
  EXPECT_FALSE(warned(
      {"parallel.pp=2", "parallel.schedule=stp", "memory.optimizer_offload=all", "memory.optimizer_overlap=all"}));
}

// The shadows are pinned host memory the plan counts: measured optimizer host bytes == predicted,
// with them, and they are 8 bytes per speculating element more than without (12 with a host
// master); auto keeps them when the host budget holds them and drops them when it does not.
TEST(OptimizerOverlapMemory, ShadowsAreInThePlanToTheByte) {
  // f32, bf16 (host masters), and f32 at dp 2 (replicated: the dry run plans one replica).
  for (int variant : {0, 1, 2}) {
    const bool bf16 = variant == 1;
    SCOPED_TRACE(variant == 0 ? "f32" : variant == 1 ? "bf16" : "f32, dp 2");
    auto run = [&](const char* overlap, const std::string& host_budget) {
      std::vector<std::string> o = {"parallel.schedule=stp", "parallel.pp=2", "memory.optimizer_offload=all",
                                    std::string("memory.optimizer_overlap=") + overlap};
      if (bf16) o.push_back("train.precision=bf16");
      if (variant == 2) o.insert(o.end(), {"parallel.dp=2", "train.microbatches=4"});
      if (!host_budget.empty()) o.push_back("memory.host_budget=" + host_budget);
      stp::Config cfg = tiny_config(o);
      cfg.output.dir = fresh_dir("ovl_memory");
      stp::Trainer t(cfg);
      t.step();
      const stp::StepResult r = t.step();
      const auto mem = t.device_memory();
      std::uint64_t pinned = 0;
      for (std::size_t g = 0; g < mem.size(); ++g) {
        const auto& predicted = t.memory_plan().predicted;  // one replica
        const stp::RankPrediction& p = predicted.at(g % predicted.size());
        EXPECT_EQ(mem[g].optimizer_host_bytes, p.optimizer_host_bytes) << overlap << " device " << g;
        EXPECT_EQ(mem[g].optimizer_shadow_bytes, p.optimizer_shadow_bytes) << overlap << " device " << g;
        pinned += p.host_pinned_bytes + p.optimizer_host_bytes;
      }
      EXPECT_EQ(r.peak_host_pinned_bytes, pinned) << overlap;
      return std::make_pair(t.memory_plan(), mem);
    };
    const auto [none_plan, none] = run("none", "");
    const auto [all_plan, all] = run("all", "");
    EXPECT_FALSE(none_plan.optimizer_overlap);
    EXPECT_TRUE(all_plan.optimizer_overlap);
    std::size_t none_total = 0, all_total = 0;
    for (std::size_t g = 0; g < none.size(); ++g) {
      EXPECT_EQ(none[g].optimizer_shadow_bytes, 0u);
      EXPECT_EQ(all[g].optimizer_host_bytes - none[g].optimizer_host_bytes, all[g].optimizer_shadow_bytes);
    }
    // The plan's totals (one replica; the process pins every replica's, train/host_needs.h, which
    // is what check_plan and auto hold against memory.host_budget).
    for (const stp::RankPrediction& p : none_plan.predicted) none_total += p.optimizer_host_bytes;
    for (const stp::RankPrediction& p : all_plan.predicted) all_total += p.optimizer_host_bytes;
    EXPECT_GT(all_total, none_total) << "no chunk speculates";
    const std::size_t replicas = variant == 2 ? 2 : 1;
    // auto: all with a roomy host budget, none when the shadows do not fit.
    const auto [roomy, roomy_mem] = run("auto", "");
    EXPECT_TRUE(roomy.optimizer_overlap);
    const auto [tight, tight_mem] = run("auto", std::to_string(replicas * (none_total + (all_total - none_total) / 2)));
    EXPECT_FALSE(tight.optimizer_overlap);
    for (std::size_t g = 0; g < tight_mem.size(); ++g) EXPECT_EQ(tight_mem[g].optimizer_shadow_bytes, 0u);
  }
}

}  // namespace
