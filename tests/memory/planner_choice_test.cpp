// The lever choice (plan_memory) on its own, driven by an analytic fake cost model instead of dry
// runs: synthetic units with known bytes and costs, a peak that is the model states plus the bytes
// each unit keeps. Against a brute force over every keep / offload / recompute assignment: the
// choice fits the budget whenever any assignment does, the minimum feasible budget is exact, and
// the choice is the cheapest assignment in all but a few cases. The greedy (cheapest cost per byte
// first, never undone) is a heuristic for what is a knapsack problem: e.g. when the link can hide
// only some offloads, taking the first free one may leave no free one for the bytes still over.
// An infeasible budget must name the minimum feasible budget and what remains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "memory/planner.h"
#include "tests/memory/planner_fake.h"

namespace {

using namespace stp::testing;

// `units` candidates per rank on `pp` ranks (tp 1), one chunk each, with random bytes and costs.
PlannerInput synthetic(std::mt19937& rng, int pp, int units) {
  PlannerInput in;
  in.pp = pp;
  in.tp = 1;
  in.microbatches = 4;
  in.link_bytes_per_s = 4000;  // 4 KB per compute second: a few offloads hide, more do not
  std::uniform_int_distribution<int> bytes(100, 400);
  std::uniform_real_distribution<double> frac(0.1, 0.9), fwd(0.01, 0.1);
  for (int r = 0; r < pp; ++r) {
    in.units.push_back({units});
    in.chunk_states.push_back({stp::ModelStateBytes{kWeights, kGradients, kOptimizer}});
    for (int u = 0; u < units; ++u) {
      PlanCandidate c;
      c.pp_rank = r;
      c.unit = u;
      c.name = "h." + std::to_string(u);
      c.offload_bytes = static_cast<std::size_t>(bytes(rng));
      c.full_saving = c.offload_bytes - static_cast<std::size_t>(frac(rng) * 60);  // Full keeps the input
      c.selective_saving = static_cast<std::size_t>(frac(rng) * static_cast<double>(c.full_saving));
      c.forward_s = fwd(rng);
      c.selective_cost = frac(rng) * 0.5;
      c.full_cost = 1.0;
      in.candidates.push_back(c);
    }
  }
  in.evaluate = [&in](std::vector<RankPlan>& plans) {
    std::vector<Choice> choice = choices_of(in, plans);
    std::vector<RankPrediction> out;
    for (int r = 0; r < in.pp; ++r) out.push_back(predict(in, r, choice));
    return out;
  };
  return in;
}

// Every keep / offload / recompute assignment of one rank's candidates that the policies allow.
Best brute_force(const PlannerInput& in, int rank, std::size_t budget) {
  std::vector<std::size_t> mine;
  for (std::size_t i = 0; i < in.candidates.size(); ++i)
    if (in.candidates[i].pp_rank == rank) mine.push_back(i);
  std::vector<Choice> options;
  for (bool off : {false, true}) {
    if (off && in.offload == OffloadPolicy::None) continue;
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      if (r != Recompute::None && in.recompute == RecomputePolicy::None) continue;
      options.push_back({off, r});
    }
  }
  Best best;
  std::vector<Choice> choice(in.candidates.size());
  std::size_t combos = 1;
  for (std::size_t k = 0; k < mine.size(); ++k) combos *= options.size();
  for (std::size_t code = 0; code < combos; ++code) {
    std::size_t x = code;
    for (std::size_t i : mine) choice[i] = options[x % options.size()], x /= options.size();
    RankPrediction p = predict(in, rank, choice);
    best.min_peak = std::min(best.min_peak, p.peak_device_bytes);
    if (p.peak_device_bytes > budget) continue;
    if (!best.feasible || p.step_cost_s() < best.cost) best.cost = p.step_cost_s();
    best.feasible = true;
  }
  return best;
}

// Budgets from generous to below the minimum, on random small problems (2 ranks of 3 units: 6^3
// assignments per rank). Measured: the cheapest assignment in 99.4% of 9000 cases of this kind (a
// model of the same greedy); required here: at least 98%, every fitting case feasible.
TEST(PlannerChoice, FitsTheBudgetAtTheLeastPredictedCost) {
  std::mt19937 rng(20240611);
  int cases = 0, cheapest = 0, infeasible = 0;
  for (int trial = 0; trial < 200; ++trial) {
    PlannerInput in = synthetic(rng, 2, 3);
    const std::size_t keep_all = predict(in, 0, std::vector<Choice>(in.candidates.size())).peak_device_bytes;
    for (double f : {1.0, 0.9, 0.8, 0.7, 0.6}) {
      const std::size_t budget = static_cast<std::size_t>(f * static_cast<double>(keep_all));
      in.device_budget = budget;
      SCOPED_TRACE(testing::Message() << "trial " << trial << " budget " << budget);
      stp::MemoryPlan plan = plan_memory(in);
      std::vector<Choice> chosen = choices_of(in, plan.ranks);
      bool all_fit = true;
      for (int r = 0; r < in.pp; ++r) {
        Best best = brute_force(in, r, budget);
        all_fit = all_fit && best.feasible;
        if (!best.feasible) continue;
        RankPrediction p = predict(in, r, chosen);
        ASSERT_TRUE(plan.feasible);
        EXPECT_LE(p.peak_device_bytes, budget) << "rank " << r;
        EXPECT_GE(p.step_cost_s(), best.cost - 1e-12) << "rank " << r << ": cheaper than the brute force";
        if (p.step_cost_s() <= best.cost + 1e-12) ++cheapest;
        EXPECT_EQ(plan.predicted[static_cast<std::size_t>(r)].peak_device_bytes, p.peak_device_bytes);
        ++cases;
      }
      EXPECT_EQ(plan.feasible, all_fit);
      if (!all_fit) ++infeasible;
      // The minimum feasible budget is the least peak of any assignment, the worst rank's.
      std::size_t min_budget = 0;
      for (int r = 0; r < in.pp; ++r) min_budget = std::max(min_budget, brute_force(in, r, 0).min_peak);
      EXPECT_EQ(plan.min_device_budget, min_budget);
      // Every chunk's optimizer stays on the device.
      for (const RankPlan& rp : plan.ranks)
        for (std::size_t ch = 0; ch < rp.units.size(); ++ch)
          EXPECT_EQ(rp.optimizer_placement(static_cast<int>(ch)), stp::OptimizerPlacement::Device);
    }
  }
  EXPECT_GT(cases, 1000);
  EXPECT_GE(cheapest, cases * 98 / 100) << cheapest << " of " << cases << " fitting cases chose the cheapest plan";
  std::printf("[ planner ] the cheapest plan in %d of %d fitting cases\n", cheapest, cases);
  EXPECT_GT(infeasible, 0) << "no budget below the minimum was tried";
}

// The policies restrict the choice: offload none never offloads, recompute none never recomputes,
// and the brute force under the same restriction is matched.
TEST(PlannerChoice, RespectsThePolicies) {
  std::mt19937 rng(7);
  for (auto [off, rec] :
       {std::pair{OffloadPolicy::None, RecomputePolicy::Auto}, std::pair{OffloadPolicy::Auto, RecomputePolicy::None}}) {
    PlannerInput in = synthetic(rng, 1, 3);
    in.offload = off;
    in.recompute = rec;
    const std::size_t keep_all = predict(in, 0, std::vector<Choice>(in.candidates.size())).peak_device_bytes;
    in.device_budget = keep_all * 8 / 10;
    stp::MemoryPlan plan = plan_memory(in);
    Best best = brute_force(in, 0, in.device_budget);
    ASSERT_EQ(plan.feasible, best.feasible);
    for (const Choice& c : choices_of(in, plan.ranks)) {
      if (off == OffloadPolicy::None) {
        EXPECT_FALSE(c.offload);
      }
      if (rec == RecomputePolicy::None) {
        EXPECT_EQ(c.level, Recompute::None);
      }
    }
    if (best.feasible) {
      EXPECT_GE(plan.predicted[0].step_cost_s(), best.cost - 1e-12);
    }
  }
}

// Below the minimum: not feasible, the minimum is exact, and the message names it and every part
// of what remains.
TEST(PlannerChoice, InfeasibleBudgetNamesTheMinimumAndWhatRemains) {
  std::mt19937 rng(3);
  PlannerInput in = synthetic(rng, 2, 3);
  std::size_t min_budget = std::max(brute_force(in, 0, 0).min_peak, brute_force(in, 1, 0).min_peak);
  in.device_budget = min_budget - 1;
  stp::MemoryPlan plan = plan_memory(in);
  EXPECT_FALSE(plan.feasible);
  EXPECT_EQ(plan.min_device_budget, min_budget);
  std::string what = stp::describe_infeasible(plan);
  for (const char* part :
       {"weights", "gradients", "optimizer state", "activations", "buffers and workspace", "minimum feasible budget"})
    EXPECT_NE(what.find(part), std::string::npos) << part << " missing: " << what;
  // One size per number: the minimum rounded up (setting it fits), its exact bytes under Exact.
  const std::string minimum = stp::format_bytes(min_budget, stp::ByteStyle::Human, stp::Rounding::Up);
  EXPECT_NE(what.find("minimum feasible budget is " + minimum), std::string::npos) << what;
  EXPECT_EQ(what.find(std::to_string(min_budget)), std::string::npos) << what;
  const std::string exact = stp::describe_infeasible(plan, stp::ByteStyle::Exact);
  EXPECT_NE(exact.find("minimum feasible budget is " + std::to_string(min_budget) + " B"), std::string::npos) << exact;
  in.device_budget = min_budget;
  EXPECT_TRUE(plan_memory(in).feasible);
}

}  // namespace
