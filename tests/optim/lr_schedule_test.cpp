#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

#include "config/config.h"
#include "optim/lr_schedule.h"

using namespace stp;

TEST(LrSchedule, ConstantWithoutWarmupIsConstant) {
  LrSchedule s{"constant", 1e-3, 1e-5, 0, 50};
  for (int step = 1; step <= 60; ++step) EXPECT_EQ(s.at(step), 1e-3) << step;
}

TEST(LrSchedule, LinearWarmupThenConstant) {
  LrSchedule s{"constant", 1e-3, 0, 4, 10};
  EXPECT_DOUBLE_EQ(s.at(1), 0.25e-3);
  EXPECT_DOUBLE_EQ(s.at(2), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.at(4), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(5), 1e-3);
}

TEST(LrSchedule, CosineFollowsTheDocumentedFormula) {
  LrSchedule s{"cosine", 6e-4, 6e-5, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(5), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 6e-4);                        // peak at the end of warm-up
  EXPECT_DOUBLE_EQ(s.at(60), 6e-5 + 0.5 * (6e-4 - 6e-5));  // half way: the mean
  EXPECT_DOUBLE_EQ(s.at(110), 6e-5);                       // min_lr at the last step
  EXPECT_DOUBLE_EQ(s.at(200), 6e-5);
  double p = 25.0 / 100.0;
  EXPECT_DOUBLE_EQ(s.at(35), 6e-5 + 0.5 * (6e-4 - 6e-5) * (1 + std::cos(std::numbers::pi * p)));
  for (int step = 11; step < 110; ++step) EXPECT_LT(s.at(step + 1), s.at(step));
}

TEST(LrSchedule, FromConfigUsesTrainKnobs) {
  Config c = load_config_from_string("", "t", {"train.lr_schedule=constant", "train.warmup_steps=0", "train.lr=0.01"});
  LrSchedule s = LrSchedule::from_config(c.train);
  EXPECT_EQ(s.at(1), 0.01);
  EXPECT_EQ(s.at(200), 0.01);
  LrSchedule d = LrSchedule::from_config(load_config_from_string("", "t").train);
  EXPECT_DOUBLE_EQ(d.at(10), 3e-4);
  EXPECT_DOUBLE_EQ(d.at(200), 3e-5);
}
