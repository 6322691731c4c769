#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "config/config.h"
#include "base/error.h"

namespace stp {

LrSchedule LrSchedule::from_config(const TrainConfig& t) {
  return LrSchedule{t.lr_schedule, t.lr, t.min_lr, t.warmup_steps, t.steps};
}

double LrSchedule::at(std::int64_t step) const {
  STP_ASSERT(step >= 1, "lr schedule: steps are 1-based, got ", step);
  if (step <= warmup_steps) return lr * double(step) / double(warmup_steps);
  if (kind == "constant") return lr;
  STP_ASSERT(kind == "cosine", "unknown lr schedule ", kind);
  double p = std::min(1.0, double(step - warmup_steps) / double(std::max<std::int64_t>(1, steps - warmup_steps)));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace stp
