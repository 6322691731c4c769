#include "memory/plan.h"

namespace stp {

bool RankPlan::offloads() const {
  for (const auto& chunk : units)
    for (const UnitPlan& u : chunk)
      if (u.offload) return true;
  return false;
}

OptimizerPlacement RankPlan::optimizer_placement(int chunk) const {
  return static_cast<std::size_t>(chunk) < optimizer.size() ? optimizer[static_cast<std::size_t>(chunk)]
                                                            : OptimizerPlacement::Device;
}

const char* to_string(OptimizerPlacement p) { return p == OptimizerPlacement::Host ? "host" : "device"; }

}  // namespace stp
