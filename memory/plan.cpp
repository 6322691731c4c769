#include "memory/plan.h"

namespace stp {

bool RankPlan::offloads() const {
  for (const auto& chunk : units)
    for (const UnitPlan& u : chunk)
      if (u.offload) return true;
  return false;
}

}  // namespace stp
