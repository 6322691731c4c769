// The optimizer placement (optimizer_offload: auto) chosen by plan_memory on its own, against a
// brute force over every placement of the chunks of an analytic fake (placement_problem,
// tests/memory/planner_fake.h): it fits whenever a placement does, at the cheapest placement's
// cost; it competes with the activation levers on cost per byte; an infeasible budget names the
// minimum.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/planner.h"
#include "tests/memory/planner_fake.h"

namespace {

using namespace stp::testing;
using stp::OptimizerPlacement;

std::vector<stp::OptimizerPlacement> placement(const stp::MemoryPlan& plan) {
  std::vector<stp::OptimizerPlacement> out;
  for (std::size_t ch = 0; ch < plan.ranks.at(0).units.size(); ++ch)
    out.push_back(plan.ranks[0].optimizer_placement(static_cast<int>(ch)));
  return out;
}

// Every placement of the chunks: the least cost of one that fits, and the least peak of any.
Best brute_force_placement(PlannerInput& in, std::size_t budget) {
  Best best;
  const std::size_t n = in.chunk_states[0].size();
  for (std::size_t code = 0; code < (std::size_t{1} << n); ++code) {
    std::vector<RankPlan> plans(1);
    plans[0].units.assign(n, std::vector<stp::UnitPlan>(1));
    double cost = 0;
    for (std::size_t ch = 0; ch < n; ++ch) {
      const bool host = (code >> ch) & 1;
      plans[0].optimizer.push_back(host ? stp::OptimizerPlacement::Host : stp::OptimizerPlacement::Device);
      if (host) cost += stp::optimizer_offload_seconds(in, in.chunk_states[0][ch]);
    }
    const std::size_t peak = in.evaluate(plans)[0].peak_device_bytes;
    best.min_peak = std::min(best.min_peak, peak);
    if (peak > budget) continue;
    if (!best.feasible || cost < best.cost) best.cost = cost;
    best.feasible = true;
  }
  return best;
}

// Chunks with 3000, 1000 and 2000 optimizer bytes; all on the device the peak is 17000 B.
TEST(PlannerOptimizerPlacement, AllOnTheDeviceWhenThatFits) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.device_budget = 17000;
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(placement(plan), (std::vector<OptimizerPlacement>{kDev, kDev, kDev}));
  EXPECT_FALSE(plan.optimizer_offload);
  EXPECT_EQ(plan.predicted[0].optimizer_offload_s, 0.0);
}

// 1500 B over: the 2000 B chunk covers it at less cost than the 3000 B one (and the 1000 B one
// does not cover it); the plan is the brute force's cheapest placement and names its price.
TEST(PlannerOptimizerPlacement, APartialPlacementWhenItSufficesAndIsCheaper) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.device_budget = 15500;
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(placement(plan), (std::vector<OptimizerPlacement>{kDev, kDev, kHost}));
  EXPECT_TRUE(plan.optimizer_offload);
  EXPECT_EQ(plan.predicted[0].peak_device_bytes, 15000u);
  const Best best = brute_force_placement(in, in.device_budget);
  EXPECT_DOUBLE_EQ(plan.predicted[0].optimizer_offload_s, best.cost);
  EXPECT_DOUBLE_EQ(best.cost, stp::optimizer_offload_seconds(in, in.chunk_states[0][2]));
  // 3500 B over: two chunks (3000 + 1000) are the cheapest cover (1000 + 2000 falls short).
  in.device_budget = 13500;
  plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(placement(plan), (std::vector<OptimizerPlacement>{kHost, kHost, kDev}));
  EXPECT_DOUBLE_EQ(plan.predicted[0].optimizer_offload_s, brute_force_placement(in, in.device_budget).cost);
}

// Every budget from all-on-the-device down to the minimum: the plan fits whenever a placement does,
// and costs what the cheapest fitting placement costs.
TEST(PlannerOptimizerPlacement, EveryBudgetMatchesTheBruteForce) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  int cheapest = 0, cases = 0;
  for (std::size_t budget = 17000; budget >= 11000; budget -= 250) {
    in.device_budget = budget;
    SCOPED_TRACE(testing::Message() << "budget " << budget);
    stp::MemoryPlan plan = plan_memory(in);
    const Best best = brute_force_placement(in, budget);
    ASSERT_EQ(plan.feasible, best.feasible);
    if (!best.feasible) continue;
    EXPECT_LE(plan.predicted[0].peak_device_bytes, budget);
    EXPECT_GE(plan.predicted[0].optimizer_offload_s, best.cost - 1e-12);
    if (plan.predicted[0].optimizer_offload_s <= best.cost + 1e-12) ++cheapest;
    ++cases;
  }
  EXPECT_EQ(cases, 25);
  EXPECT_EQ(cheapest, cases);
}

// Only all three chunks on the host fit (11000 B of weights, gradients and activations).
TEST(PlannerOptimizerPlacement, AllOnTheHostWhenNeeded) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.device_budget = 11000;
  stp::MemoryPlan plan = plan_memory(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(placement(plan), (std::vector<OptimizerPlacement>{kHost, kHost, kHost}));
  EXPECT_EQ(plan.min_device_budget, 11000u);
  // optimizer_offload: all puts every chunk on the host whatever the budget.
  in.optimizer_offload = OffloadPolicy::All;
  in.device_budget = 17000;
  EXPECT_EQ(placement(plan_memory(in)), (std::vector<OptimizerPlacement>{kHost, kHost, kHost}));
}

// optimizer_overlap: of the host chunks without a tied parameter only the dearest counts (the last
// one's update follows the backward, the others overlap it); a tied chunk counts in full.
TEST(PlannerOptimizerPlacement, OverlapCountsOnlyTheDearestEarlyChunk) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.optimizer_offload = OffloadPolicy::All;
  const auto cost = [&](std::size_t ch) { return stp::optimizer_offload_seconds(in, in.chunk_states[0][ch]); };
  const double sum = cost(0) + cost(1) + cost(2);
  EXPECT_DOUBLE_EQ(plan_memory(in).predicted[0].optimizer_offload_s, sum);
  in.optimizer_overlap = true;
  EXPECT_DOUBLE_EQ(plan_memory(in).predicted[0].optimizer_offload_s, cost(0));
  in.chunk_states[0][0].tied = true;  // the dearest waits for the tied sum: the next one hides
  EXPECT_DOUBLE_EQ(plan_memory(in).predicted[0].optimizer_offload_s, cost(0) + cost(2));
}

// A streamed chunk (RankPlan::param_stream) is updated in place in pinned host memory: the CPU
// AdamW's term only, no link copies.
TEST(PlannerOptimizerPlacement, AStreamedChunkCostsOnlyTheCpuUpdate) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.optimizer_offload = OffloadPolicy::All;
  const auto evaluate = in.evaluate;
  in.evaluate = [evaluate](std::vector<RankPlan>& plans) {
    for (RankPlan& p : plans) p.param_stream.assign(p.units.size(), true);
    return evaluate(plans);
  };
  double sum = 0;
  for (const stp::ModelStateBytes& b : in.chunk_states[0]) {
    const double cpu = 7.0 * static_cast<double>(b.optimizer) / 2 / in.cpu_adamw_bytes_per_s;
    EXPECT_DOUBLE_EQ(stp::optimizer_offload_seconds(in, b, /*streamed=*/true), cpu);
    EXPECT_LT(cpu, stp::optimizer_offload_seconds(in, b));
    sum += cpu;
  }
  EXPECT_DOUBLE_EQ(plan_memory(in).predicted[0].optimizer_offload_s, sum);
}

// Below what all-on-the-host needs: infeasible, naming that minimum; with the optimizer pinned to
// the device (none) the minimum is the device placement's.
TEST(PlannerOptimizerPlacement, InfeasibleNamesTheMinimum) {
  PlannerInput in = placement_problem({3000, 1000, 2000});
  in.device_budget = 10999;
  stp::MemoryPlan plan = plan_memory(in);
  EXPECT_FALSE(plan.feasible);
  EXPECT_EQ(plan.min_device_budget, 11000u);
  const std::string what = stp::describe_infeasible(plan, stp::ByteStyle::Exact);
  EXPECT_NE(what.find("minimum feasible budget is 11000 B"), std::string::npos) << what;
  EXPECT_NE(stp::describe_infeasible(plan).find("minimum feasible budget is 10.8 KiB"), std::string::npos)
      << stp::describe_infeasible(plan);  // 10.74 KiB rounded up
  in.optimizer_offload = OffloadPolicy::None;
  in.device_budget = 16999;
  plan = plan_memory(in);
  EXPECT_FALSE(plan.feasible);
  EXPECT_EQ(plan.min_device_budget, 17000u);
}

// Jointly with the activation levers: the optimizer move competes with recompute on cost per byte.
// A unit whose Full recompute frees 2000 B for 0.01 s beats moving a chunk's state (far dearer at
// these rates); with recompute priced higher than the chunk move, the chunk moves instead.
TEST(PlannerOptimizerPlacement, CompetesWithTheActivationLevers) {
  for (double forward_s : {0.01, 1000.0}) {
    PlannerInput in = placement_problem({3000, 1000, 2000});
    in.recompute = RecomputePolicy::Auto;
    PlanCandidate c;
    c.name = "h.0";
    c.offload_bytes = 2500;
    c.full_saving = 2000;
    c.forward_s = forward_s;
    c.full_cost = 1.0;
    in.microbatches = 1;
    in.candidates.push_back(c);
    auto fake = in.evaluate;
    in.evaluate = [&in, fake](std::vector<RankPlan>& plans) {
      std::vector<RankPrediction> p = fake(plans);
      const stp::UnitPlan& u = plans[0].units[0][0];
      const bool full = u.recompute == Recompute::Full;
      p[0].peak_device_bytes += full ? 500 : 2500;
      p[0].recompute_s = full ? in.candidates[0].forward_s : 0;
      return p;
    };
    in.device_budget = 17000 + 2500 - 1500;  // 1500 B over
    stp::MemoryPlan plan = plan_memory(in);
    ASSERT_TRUE(plan.feasible);
    const bool recomputed = plan.ranks[0].units[0][0].recompute == Recompute::Full;
    SCOPED_TRACE(testing::Message() << "forward " << forward_s);
    EXPECT_EQ(recomputed, forward_s < 1) << "recompute s " << plan.predicted[0].recompute_s;
    EXPECT_EQ(plan.optimizer_offload, forward_s > 1);
  }
}

}  // namespace
