// Learning-rate schedules (train.lr_schedule), a pure function of the 1-based step s being taken
// (s = 1 .. steps), with peak lr = train.lr, W = train.warmup_steps, S = train.steps:
//
//   warm-up (both schedules), s <= W:    lr(s) = lr * s / W
//   constant, s > W:                     lr(s) = lr
//   cosine,   s > W:                     p     = min(1, (s - W) / max(1, S - W))
//                                        lr(s) = min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * p))
//
// So the cosine schedule reaches lr at s = W and min_lr at s = S; with lr_schedule constant and
// W = 0 the rate is lr at every step. Steps beyond S stay at min_lr (cosine) / lr (constant).
#pragma once

#include <cstdint>
#include <string>

namespace stp {

struct TrainConfig;

struct LrSchedule {
  std::string kind = "cosine";  // cosine | constant
  double lr = 3e-4;
  double min_lr = 3e-5;
  std::int64_t warmup_steps = 0;
  std::int64_t steps = 1;

  static LrSchedule from_config(const TrainConfig& train);
  double at(std::int64_t step) const;  // step is 1-based
};

}  // namespace stp
