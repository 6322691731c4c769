// The non-finite guard (train/trainer.h, StepResult::skipped). A skipped step uses up its step
// number, lr and batch and changes no state: parameters, AdamW moments and AdamW's step count stay
// as they were. So a run whose step S is skipped continues exactly as a run resumed from the state
// after step S − 1 with its step counter set to S (its checkpoint with state.json's step = S);
// the tests compare the two bitwise. The decision is the same on every rank and replica.
#include <gtest/gtest.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "tests/support/run_command.h"
#include "tests/train/guard_overflow.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::fresh_dir;

using stp::testing::NanGradHook;

const std::vector<std::string> kBase = {
    "parallel.schedule=stp", "parallel.tp=2",        "parallel.pp=2", "train.lr_schedule=cosine",
    "train.warmup_steps=2",  "data.sampling=random", "train.steps=5"};

TEST(NonFiniteGuard, InjectedNanGradientIsSkippedAndTheRunContinuesAsIfItsBatchMadeNoUpdate) {
  const int skip = 3, steps = 5;
  std::vector<stp::StepResult> guarded;
  std::map<std::string, stp::HostTensor> guarded_params;
  {
    NanGradHook hook(/*rank=*/3, skip);  // the last TP rank of the last pipeline stage
    auto cfg = stp::testing::tiny_config(kBase);
    cfg.output.dir = fresh_dir("guard_nan");
    stp::Trainer t(cfg);
    for (int i = 0; i < steps; ++i) guarded.push_back(t.step());
    guarded_params = t.full_parameters();
    EXPECT_EQ(t.last_update_step(), steps);
  }
  for (const auto& r : guarded) {
    EXPECT_EQ(r.skipped, r.step == skip) << "step " << r.step;
    EXPECT_EQ(r.skipped_steps, r.step >= skip ? 1 : 0) << "step " << r.step;
    EXPECT_TRUE(std::isfinite(r.loss)) << "the NaN is in a gradient, the loss is fine";
    EXPECT_EQ(std::isfinite(r.grad_norm), r.step != skip) << "step " << r.step;
  }
  EXPECT_EQ(guarded[skip - 1].consecutive_skips, 1);
  EXPECT_EQ(guarded[skip].consecutive_skips, 0);

  // Reference: steps 1..S-1, a checkpoint, its step counter moved to S, resumed for S+1..5.
  std::string ckpt;
  {
    auto cfg = stp::testing::tiny_config(kBase);
    cfg.output.dir = fresh_dir("guard_reference");
    stp::Trainer t(cfg);
    for (int i = 1; i < skip; ++i) {
      stp::StepResult r = t.step();
      EXPECT_EQ(r.loss, guarded[static_cast<std::size_t>(i - 1)].loss) << "step " << i;
    }
    ckpt = t.save_checkpoint();
  }
  {
    std::filesystem::path state = std::filesystem::path(ckpt) / "state.json";
    nlohmann::json j = nlohmann::json::parse(stp::testing::slurp(state.string()));
    j["step"] = skip;
    std::ofstream(state) << j.dump(2);
  }
  auto cfg = stp::testing::tiny_config(kBase);
  cfg.output.dir = std::filesystem::path(ckpt).parent_path().string();
  cfg.train.resume = ckpt;
  stp::Trainer t(cfg);
  ASSERT_EQ(t.steps_done(), skip);
  for (int s = skip + 1; s <= steps; ++s) {
    stp::StepResult r = t.step();
    EXPECT_EQ(r.loss, guarded[static_cast<std::size_t>(s - 1)].loss) << "step " << s;
    EXPECT_EQ(r.lr, guarded[static_cast<std::size_t>(s - 1)].lr) << "step " << s;
  }
  EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), guarded_params));
}

// A NaN on one rank of one replica only (after the data-parallel sum): every rank of both
// replicas skips, so the replicas stay identical; with the distributed optimizer too (the NaN then
// lands in the part of the gradient rank 0 owns).
TEST(NonFiniteGuard, EveryReplicaSkipsWhenOneRankSeesANan) {
  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed optimizer" : "replicated optimizer");
    NanGradHook hook(/*rank=*/0, /*step=*/2);
    auto cfg = stp::testing::tiny_config({"parallel.dp=2", "parallel.pp=1", "parallel.tp=1", "train.steps=3",
                                          distributed ? "parallel.distributed_optimizer=true" : "parallel.dp=2"});
    cfg.output.dir = fresh_dir(distributed ? "guard_dp_dist" : "guard_dp");
    stp::Trainer t(cfg);
    auto before = std::map<std::string, stp::HostTensor>();
    t.step();
    before = t.full_parameters(1);
    stp::StepResult r = t.step();
    EXPECT_TRUE(r.skipped);
    EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(1), before)) << "replica 1 updated";
    EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(0), before)) << "replica 0 updated";
    EXPECT_FALSE(t.step().skipped);
    EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(0), t.full_parameters(1)));
  }
}

// The health numbers of a normal step: the norm before clipping and the coefficient applied.
TEST(NonFiniteGuard, GradNormAndClipCoefficient) {
  auto cfg = stp::testing::tiny_config({"train.grad_clip=0.01"});
  cfg.output.dir = fresh_dir("guard_clip");
  stp::Trainer t(cfg);
  stp::StepResult r = t.step();
  EXPECT_FALSE(r.skipped);
  EXPECT_GT(r.grad_norm, 0.01);
  EXPECT_NEAR(r.clip_coef, 0.01 / (r.grad_norm + 1e-6), 1e-6);
  EXPECT_EQ(r.tokens_seen, 2 * 8 * 16);
  auto unclipped = stp::testing::tiny_config({"train.grad_clip=0"});
  unclipped.output.dir = fresh_dir("guard_noclip");
  stp::Trainer u(unclipped);
  stp::StepResult q = u.step();
  EXPECT_EQ(q.clip_coef, 1.0);
  EXPECT_DOUBLE_EQ(q.grad_norm, r.grad_norm) << "the same first step, with or without clipping";
}

// An update that overflows although train.lr passed validation (tests/train/guard_overflow.h: an
// embedding row near FLT_MAX that no batch reads, a decay factor 1 - lr * weight_decay of -1 in
// step 1 and -3 in step 2): step 2's loss and gradient norm are finite, so the guard updates, and
// the row becomes infinite. That state is never written as a checkpoint: saving it is an error
// naming the tensor, and the last good state stays the checkpoint of step 1. For every mechanism
// that updates the parameters: on the device, the CPU update of offloaded state (still in flight
// when step() returns), and the distributed optimizer's shards.
class NonFiniteState : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(NonFiniteState, AStateThatOverflowedIsNeverCalledGood) {
  const std::string dir = fresh_dir("guard_overflow");
  stp::Config cfg = stp::testing::overflow_config(GetParam(), dir);
  stp::Trainer t(cfg);
  EXPECT_FALSE(t.step().skipped);
  const std::string good = t.save_checkpoint();
  for (const auto& [name, tensor] : stp::read_model_tensors(good + "/model.safetensors"))
    for (float v : tensor.data) ASSERT_TRUE(std::isfinite(v)) << name;
  const stp::StepResult r = t.step();
  EXPECT_FALSE(r.skipped) << "the overflowing row is read by no batch: loss and gradient stay finite";
  EXPECT_TRUE(std::isfinite(r.loss));
  try {
    t.save_checkpoint();
    ADD_FAILURE() << "a state holding an infinite parameter was written as a checkpoint";
  } catch (const stp::Error& e) {
    const std::string what = e.what();
    for (const char* needle : {"after step 2", "model.embed_tokens.weight", "not finite", "checkpoint-1"})
      EXPECT_NE(what.find(needle), std::string::npos) << needle << " in: " << what;
  }
  EXPECT_FALSE(std::filesystem::exists(stp::checkpoint_path(dir, 2))) << "the bad state reached the disk";
  EXPECT_EQ(stp::find_latest_checkpoint(dir), good);
  // No later step makes it good again (the row's gradient is zero: it stays infinite), and the
  // last good state stays step 1's.
  EXPECT_FALSE(t.step().skipped);
  const stp::CheckpointSave s = t.try_save_checkpoint();
  EXPECT_FALSE(s.written);
  EXPECT_EQ(s.path, "");
  for (const std::string& needle : {std::string("the state after step 3 is not finite"),
                                    std::string("model.safetensors: tensor 'model.embed_tokens.weight' holds 1 value"),
                                    "The last good state is checkpoint " + good + " (after step 1)"})
    EXPECT_NE(s.problem.find(needle), std::string::npos) << needle << " in: " << s.problem;
  EXPECT_EQ(stp::find_latest_checkpoint(dir), good);
}

// Where no checkpoint was written yet, the message says so and names where the run started; a
// resumed run names its train.resume checkpoint, whose values were checked on import.
TEST(NonFiniteGuard, TheLastGoodStateIsTheResumeCheckpointOrNone) {
  const std::string dir = fresh_dir("guard_overflow_start");
  std::string good;
  {
    stp::Trainer t(stp::testing::overflow_config({}, dir));
    t.step();
    t.step();
    const stp::CheckpointSave s = t.try_save_checkpoint();
    EXPECT_FALSE(s.written);
    EXPECT_NE(s.problem.find("No checkpoint holds a good state of this run: it started from model.init_from '"),
              std::string::npos)
        << s.problem;
  }
  {
    stp::Trainer t(stp::testing::overflow_config({"train.steps=1"}, dir));
    t.step();
    good = t.save_checkpoint();
  }
  stp::Config cfg = stp::testing::overflow_config({}, dir);
  cfg.train.resume = good;
  stp::Trainer t(cfg);
  t.step();
  const stp::CheckpointSave s = t.try_save_checkpoint();
  EXPECT_FALSE(s.written);
  EXPECT_NE(s.problem.find("The last good state is the train.resume checkpoint " + good + " (after step 1)"),
            std::string::npos)
      << s.problem;
}

const std::vector<std::vector<std::string>> kMechanisms = {
    {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp"},
    {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp", "memory.optimizer_offload=all"},
    {"parallel.dp=2", "parallel.distributed_optimizer=true"}};

std::string mechanism_name(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  static const char* const names[] = {"device", "offloaded", "distributed"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, NonFiniteState, ::testing::ValuesIn(kMechanisms), mechanism_name);

}  // namespace
