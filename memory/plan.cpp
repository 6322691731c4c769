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

bool RankPlan::streams_params(int chunk) const {
  return static_cast<std::size_t>(chunk) < param_stream.size() && param_stream[static_cast<std::size_t>(chunk)];
}

bool RankPlan::streams_any() const {
  for (bool s : param_stream)
    if (s) return true;
  return false;
}

const char* to_string(OptimizerPlacement p) { return p == OptimizerPlacement::Host ? "host" : "device"; }

}  // namespace stp
