// The analytic fakes the planner tests (tests/memory/planner_*_test.cpp) drive plan_memory with in
// place of dry runs: fixed model states, a fake model of one pp rank's units (predict), one rank
// with chunks of different optimizer sizes (placement_problem) and one rank with two offloadable
// units (late_reload_problem). Each fake's comment says what its peak is made of.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/planner.h"

namespace stp::testing {

// The planner types every test file names (a test file's `using namespace stp::testing;` brings them).
using stp::OffloadPolicy;
using stp::PlanCandidate;
using stp::PlannerInput;
using stp::RankPlan;
using stp::RankPrediction;
using stp::Recompute;
using stp::RecomputePolicy;

constexpr std::size_t kWeights = 1000, kGradients = 1000, kOptimizer = 2000, kBuffers = 300;
constexpr double kCompute = 1.0;  // seconds per step, every rank

// One unit's decision, as the fake model reads it.
struct Choice {
  bool offload = false;
  Recompute level = Recompute::None;
};

inline std::size_t saving(const PlanCandidate& c, Recompute r) {
  return r == Recompute::Full ? c.full_saving : r == Recompute::Selective ? c.selective_saving : 0;
}

inline double cost_fraction(const PlanCandidate& c, Recompute r) {
  return r == Recompute::Full ? c.full_cost : r == Recompute::Selective ? c.selective_cost : 0;
}

// The fake model of one pp rank: every microbatch's records live until the step ends (peak =
// model states + buffers + m x kept bytes); offloaded units keep nothing and copy what F leaves
// (their offload_bytes) per microbatch; recompute costs its fraction of the forward per microbatch.
inline RankPrediction predict(const PlannerInput& in, int rank, const std::vector<Choice>& choice) {
  RankPrediction p;
  std::size_t activations = 0;
  std::uint64_t copied = 0;
  for (std::size_t i = 0; i < in.candidates.size(); ++i) {
    const PlanCandidate& c = in.candidates[i];
    if (c.pp_rank != rank) continue;
    const Choice& d = choice[i];
    if (d.offload) copied += static_cast<std::uint64_t>(in.microbatches) * c.offload_bytes;
    else activations += static_cast<std::size_t>(in.microbatches) * (c.offload_bytes - saving(c, d.level));
    p.recompute_s += in.microbatches * c.forward_s * cost_fraction(c, d.level);
  }
  p.peak_by_category = {kWeights, kGradients, kOptimizer, activations, kBuffers};
  p.peak_device_bytes = kWeights + kGradients + kOptimizer + activations + kBuffers;
  p.offload_bytes_per_step = copied;
  p.compute_s = kCompute;
  p.exposed_copy_s = std::max(0.0, static_cast<double>(copied) / in.link_bytes_per_s - kCompute);
  return p;
}

inline std::vector<Choice> choices_of(const PlannerInput& in, const std::vector<RankPlan>& plans) {
  std::vector<Choice> out;
  for (const PlanCandidate& c : in.candidates) {
    const stp::UnitPlan& u = plans[static_cast<std::size_t>(c.pp_rank)]
                                 .units[static_cast<std::size_t>(c.chunk)][static_cast<std::size_t>(c.unit)];
    out.push_back({u.offload, u.recompute});
  }
  return out;
}

struct Best {
  bool feasible = false;
  double cost = 0;                  // least step cost of a fitting assignment
  std::size_t min_peak = SIZE_MAX;  // least peak of any assignment
};

// ---- The optimizer placement (optimizer_offload: auto) ------------------------------------------
// A fake of one rank with three chunks of different sizes and no activation levers: the peak is the
// model states (weights, gradients, the optimizer state of the chunks on the device) plus fixed
// activations; a host chunk costs the planner's optimizer_offload_seconds.
constexpr std::size_t kActivations = 5000;

inline PlannerInput placement_problem(std::vector<std::size_t> optimizer_bytes) {
  PlannerInput in;
  in.pp = 1;
  in.tp = 1;
  in.offload = OffloadPolicy::None;
  in.recompute = RecomputePolicy::None;
  in.optimizer_offload = OffloadPolicy::Auto;
  in.link_bytes_per_s = 1e3;
  in.cpu_adamw_bytes_per_s = 2e3;
  in.units.push_back({});
  in.chunk_states.push_back({});
  for (std::size_t b : optimizer_bytes) {
    in.units.back().push_back(1);
    in.chunk_states.back().push_back(stp::ModelStateBytes{b / 2, b / 2, b});
  }
  in.evaluate = [&in](std::vector<RankPlan>& plans) {
    RankPrediction p;
    std::size_t states = kActivations;
    for (std::size_t ch = 0; ch < in.chunk_states[0].size(); ++ch) {
      const stp::ModelStateBytes& b = in.chunk_states[0][ch];
      states += b.weights + b.gradients;
      if (plans[0].optimizer_placement(static_cast<int>(ch)) == stp::OptimizerPlacement::Device) states += b.optimizer;
    }
    p.peak_device_bytes = states;
    p.compute_s = kCompute;
    return std::vector<RankPrediction>{p};
  };
  return in;
}

constexpr OptimizerPlacement kDev = OptimizerPlacement::Device, kHost = OptimizerPlacement::Host;

// ---- Late reloads: the last activation lever -----------------------------------------------------
// A fake of one rank with two offloadable units: an offloaded set sits reloaded on the device for a
// copy's time before its B unless the rank reloads late, which frees that set's bytes and exposes
// every reload (copied bytes / link).
constexpr std::size_t kSet = 400;

inline PlannerInput late_reload_problem() {
  PlannerInput in;
  in.pp = 1;
  in.tp = 1;
  in.microbatches = 1;
  in.recompute = RecomputePolicy::None;
  in.link_bytes_per_s = 1e6;
  in.units.push_back({2});
  in.chunk_states.push_back({stp::ModelStateBytes{kWeights, kGradients, kOptimizer}});
  for (int u = 0; u < 2; ++u) {
    PlanCandidate c;
    c.unit = u;
    c.name = "h." + std::to_string(u);
    c.offload_bytes = kSet;
    c.forward_s = 0.01;
    in.candidates.push_back(c);
  }
  in.evaluate = [&in](std::vector<RankPlan>& plans) {
    RankPrediction p;
    std::size_t kept = 0, copied = 0;
    for (const stp::UnitPlan& u : plans[0].units[0]) (u.offload ? copied : kept) += kSet;
    const std::size_t early = copied > 0 && !plans[0].late_reloads ? kSet : 0;  // one set back ahead of its B
    p.peak_device_bytes = kWeights + kGradients + kOptimizer + kBuffers + kept + early;
    p.offload_bytes_per_step = copied;
    p.compute_s = kCompute;
    if (plans[0].late_reloads) p.exposed_copy_s = static_cast<double>(copied) / in.link_bytes_per_s;
    return std::vector<RankPrediction>{p};
  };
  return in;
}

}  // namespace stp::testing
