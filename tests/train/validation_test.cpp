// Validation loss (Trainer::evaluate): forward only through the pipeline on the first
// train.eval_batches global batches of data.val_path. The same number under every layout (within
// rounding: TP all-reduces sum in another order) and across resume; evaluating changes nothing
// about training; the memory plan covers it and it keeps no activation records.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::fresh_dir;

stp::Config val_config(std::vector<std::string> sets) {
  // The held-out text is the training text here: what matters is that every layout reads the same.
  sets.push_back("data.val_path=" + stp::testing::tiny_text_file());
  sets.push_back("train.eval_batches=3");
  sets.push_back("data.sampling=random");
  return stp::testing::tiny_config(sets);
}

// dp = 2 with m = 4 has the global batch of dp = 1 with m = 8: the same training and eval batches.
struct Layout {
  int dp, pp, tp;
  std::string schedule;
  int microbatches = 8;
};

TEST(Validation, IdenticalUnderEveryLayoutBeforeAndAfterTraining) {
  const std::vector<Layout> layouts = {{1, 1, 1, "gpipe"},   {1, 2, 2, "stp"},    {1, 4, 1, "zb-v"},
                                       {2, 2, 1, "1f1b", 4}, {1, 2, 1, "1f1b-i"}, {1, 4, 2, "stp"}};
  std::vector<double> at0, at2;
  for (const Layout& l : layouts) {
    auto cfg = val_config({"parallel.dp=" + std::to_string(l.dp), "parallel.pp=" + std::to_string(l.pp),
                           "parallel.tp=" + std::to_string(l.tp), "parallel.schedule=" + l.schedule,
                           "train.microbatches=" + std::to_string(l.microbatches)});
    cfg.output.dir = fresh_dir("val_layouts");
    stp::Trainer t(cfg);
    at0.push_back(t.evaluate());
    t.step();
    t.step();
    at2.push_back(t.evaluate());
  }
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    std::string name =
        "dp" + std::to_string(l.dp) + " pp" + std::to_string(l.pp) + " tp" + std::to_string(l.tp) + " " + l.schedule;
    EXPECT_NEAR(at0[i], at0[0], 1e-6 * at0[0]) << name;
    EXPECT_NEAR(at2[i], at2[0], 1e-6 * at2[0]) << name;
  }
  EXPECT_GT(at0[0], 5.0) << "random init: about ln(256) = 5.55";
  EXPECT_LT(at2[0], at0[0]) << "two steps on the same text lower the held-out loss";
}

// Evaluating between steps leaves training bitwise unchanged, and evaluating twice without a step
// between gives the same bits.
TEST(Validation, EvaluatingDoesNotChangeTrainingAndRepeatsExactly) {
  std::vector<std::string> sets = {"parallel.pp=2", "parallel.tp=2", "parallel.schedule=stp", "train.steps=4"};
  auto cfg = val_config(sets);
  cfg.output.dir = fresh_dir("val_plain");
  auto plain = stp::testing::run_training(cfg, 3);

  cfg.output.dir = fresh_dir("val_interleaved");
  stp::Trainer t(cfg);
  std::vector<double> losses;
  double first = t.evaluate();
  EXPECT_EQ(t.evaluate(), first) << "the same sequences, the same parameters: the same bits";
  for (int i = 0; i < 3; ++i) {
    losses.push_back(t.step().loss);
    t.evaluate();
  }
  EXPECT_EQ(losses, plain.losses);
  EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), plain.params));
}

TEST(Validation, SameAcrossResume) {
  std::vector<std::string> sets = {"parallel.pp=2", "parallel.tp=2", "parallel.schedule=stp", "train.steps=4"};
  auto cfg = val_config(sets);
  cfg.output.dir = fresh_dir("val_resume");
  double before = 0;
  std::string ckpt;
  {
    stp::Trainer t(cfg);
    t.step();
    t.step();
    before = t.evaluate();
    ckpt = t.save_checkpoint();
  }
  cfg.train.resume = ckpt;
  {
    stp::Trainer t(cfg);
    EXPECT_EQ(t.evaluate(), before) << "the same layout: bitwise";
  }
  auto other = val_config({"parallel.pp=4", "parallel.tp=1", "parallel.schedule=zb-v", "train.steps=4"});
  other.output.dir = cfg.output.dir;
  other.train.resume = ckpt;
  stp::Trainer t(other);
  EXPECT_NEAR(t.evaluate(), before, 1e-6 * before) << "another layout";
}

// The plan covers evaluation (its dry run evaluates too) and evaluation keeps no records: after it
// the live bytes are what they were, and the peak is the training step's.
TEST(Validation, MemoryPlanCoversEvaluationAndNothingIsKept) {
  for (std::string layout : {"parallel.schedule=stp", "parallel.schedule=zb-v"}) {
    auto cfg = val_config({"parallel.pp=2", "parallel.tp=2", layout, "memory.device_budget=8MiB", "memory.offload=auto",
                           "memory.recompute=auto"});
    cfg.output.dir = fresh_dir("val_memory");
    stp::Trainer t(cfg);
    t.step();
    t.step();
    auto after_steps = t.device_memory();
    t.evaluate();
    auto after_eval = t.device_memory();
    const auto& plan = t.memory_plan();
    for (std::size_t g = 0; g < after_eval.size(); ++g) {
      EXPECT_EQ(after_eval[g].device.allocated, after_steps[g].device.allocated) << layout << " device " << g;
      EXPECT_EQ(after_eval[g].device.peak_allocated, after_steps[g].device.peak_allocated)
          << layout << " device " << g << ": evaluation peaked above training";
      EXPECT_EQ(after_eval[g].device.peak_allocated, plan.predicted[g].peak_device_bytes) << layout << " device " << g;
      EXPECT_LE(after_eval[g].device.peak_allocated, *cfg.memory.device_budget) << layout << " device " << g;
    }
  }
}

TEST(Validation, ClearErrors) {
  auto cfg = stp::testing::tiny_config({});
  cfg.output.dir = fresh_dir("val_errors");
  stp::Trainer t(cfg);
  EXPECT_THROW(t.evaluate(), stp::Error);
  try {
    auto bad = stp::testing::tiny_config({"data.val_path=/nonexistent/val.txt"});
    stp::Trainer u(bad);
    FAIL() << "no error for a missing data.val_path";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val_path"), std::string::npos) << e.what();
  }
  try {
    stp::testing::tiny_config({"train.eval_every=5"});
    FAIL() << "no error for eval_every without val_path";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val_path"), std::string::npos) << e.what();
  }
}

}  // namespace
