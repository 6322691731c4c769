// Part 1 of bench_memory: the capacity table (the search itself: capacity_search.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/registry.h"
#include "schedule/schedule.h"
#include "tools/bench/bench_memory/capacity_search.h"
#include "tools/bench/bench_memory/parts.h"
#include "train/stage_layout.h"
#include "train/trainer.h"

namespace stp::bench_memory {

namespace {

// Parameters of the whole model of `c` (every stage, tied tensors once), from the parameter tables.
long long model_parameters(const stp::Config& c) {
  const stp::sched::Schedule sched = stp::sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  std::set<std::string> seen;
  long long n = 0;
  for (int r = 0; r < c.parallel.pp; ++r)
    for (int ch = 0; ch < sched.chunks; ++ch)
      for (const stp::ParamInfo& p :
           stp::model_param_table(stp::model_spec_of(c), stp::stage_spec_of(c, sched, r, ch, 0)))
        if (seen.insert(p.name).second) n += stp::numel(p.full_shape);
  return n;
}

// What bounds a row's depth: the strongest plan (planned for 1 MiB, so that its predictions are the
// strongest plan's and its minimum the placeable one) at half the depth and at the depth: its
// largest device's live peak and what each layer adds to it by category, and its placeable minimum.
void print_depth_bound(const Options& o, const std::vector<std::string>& levers, int step, int depth,
                       std::size_t budget) {
  std::vector<std::string> strongest = strongest_levers(levers);
  const int half = std::max(step, depth / 2 / step * step);
  if (strongest.empty() || half == depth) return;
  strongest.push_back("memory.device_budget=1MiB");
  auto worst = [](const stp::MemoryPlan& plan) {
    std::size_t g = 0;
    for (std::size_t i = 0; i < plan.predicted.size(); ++i)
      if (plan.predicted[i].peak_device_bytes > plan.predicted[g].peak_device_bytes) g = i;
    return plan.predicted.at(g);
  };
  const stp::MemoryPlan pa = probe(o, strongest, half, true).plan, pb = probe(o, strongest, depth, true).plan;
  const stp::RankPrediction a = worst(pa), b = worst(pb);
  const double layers = depth - half;
  auto per_layer = [&](std::size_t x, std::size_t y) {
    return (static_cast<double>(y) - static_cast<double>(x)) / layers / 1024;
  };
  std::string by_category;
  for (std::size_t k = 0; k < stp::kMemoryCategories; ++k) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %+.1f", k ? ", " : "", stp::to_string(static_cast<stp::MemoryCategory>(k)),
                  per_layer(a.peak_by_category[k], b.peak_by_category[k]));
    by_category += buf;
  }
  std::printf(
      "what bounds it (the strongest plan, largest device): live peak %.2f MiB at n_layer %d, %.2f MiB at %d: %.1f "
      "KiB per layer (%s); placeable minimum %.2f MiB and %.2f MiB: %.1f KiB per layer; budget %.2f MiB\n",
      mib(a.peak_device_bytes), half, mib(b.peak_device_bytes), depth,
      per_layer(a.peak_device_bytes, b.peak_device_bytes), by_category.c_str(), mib(pa.min_device_budget),
      mib(pb.min_device_budget), per_layer(pa.min_device_budget, pb.min_device_budget), mib(budget));
}

// One row of the capacity table: a set of levers. A set that needs a config key this build does
// not have (`needs`) is reported as n/a.
struct LeverSet {
  const char* name;
  std::vector<std::string> levers;
  const char* needs = nullptr;
  int depth = 0;
  long long params = 0;
};

bool has_key(const Options& o, const std::string& assignment) {
  try {
    config_with(o, {assignment});
    return true;
  } catch (const stp::Error&) {
    return false;
  }
}

// The rows of the capacity table, each row's levers including the row before's. The optimizer-offload
// lever is off in the first two rows where this build has it.
std::vector<LeverSet> lever_sets(const Options& o) {
  const bool optimizer_lever = has_key(o, "memory.optimizer_offload=none");
  std::vector<std::string> no_optimizer_offload;
  if (optimizer_lever) no_optimizer_offload.push_back("memory.optimizer_offload=none");
  std::vector<LeverSet> sets = {{"no levers", {"memory.offload=none", "memory.recompute=none"}},
                                {"activation levers", {"memory.offload=auto", "memory.recompute=auto"}},
                                {"optimizer too",
                                 {"memory.offload=auto", "memory.recompute=auto", "memory.optimizer_offload=auto"},
                                 "memory.optimizer_offload"},
                                {"all levers",
                                 {"memory.offload=auto", "memory.recompute=auto", "memory.optimizer_offload=auto",
                                  "memory.param_offload=auto", "memory.unit_tiles=auto"},
                                 "memory.param_offload"}};
  for (std::size_t i = 0; i < 2; ++i)
    sets[i].levers.insert(sets[i].levers.end(), no_optimizer_offload.begin(), no_optimizer_offload.end());
  return sets;
}

// Train the row's largest depth for one real step with the plan its probe made (the planner's, the
// one the trainer would make: planning is deterministic; or the strongest plan where it places):
// the measured peak must equal the prediction and stay within the budget. Prints the row.
void train_row(const Options& o, LeverSet& m, const Depth& d, double search_s, std::size_t budget) {
  std::vector<std::string> x = m.levers;
  x.push_back("model.n_layer=" + std::to_string(m.depth));
  const stp::Config c = config_with(o, x);
  m.params = model_parameters(c);
  stp::TrainerOptions with_plan;
  with_plan.plan = &d.plan;
  stp::Trainer t(c, with_plan);
  stp::StepResult r = t.step();
  std::size_t measured = *std::max_element(r.peak_device_bytes.begin(), r.peak_device_bytes.end());
  std::size_t predicted = max_peak(t.memory_plan());
  std::printf(
      "%-18s: largest n_layer %3d = %.2fM parameters (search %.1f s); one step: peak %.2f MiB (%s predicted, "
      "%s budget), pinned host %.1f MiB, step %.0f ms\n",
      m.name, m.depth, static_cast<double>(m.params) / 1e6, search_s, mib(measured),
      measured == predicted ? "=" : "!=", measured <= budget ? "within" : "OVER", mib(r.peak_host_pinned_bytes),
      r.step_ms);
}

// Each row's parameters against the first row's.
void print_ratios(const std::vector<LeverSet>& sets) {
  if (sets[0].params == 0) return;
  for (std::size_t i = 1; i < sets.size(); ++i)
    if (sets[i].params)
      std::printf("capacity ratio, %s / no levers: %.2fx in parameters (%.2fM / %.2fM; %d / %d layers)%s\n",
                  sets[i].name, static_cast<double>(sets[i].params) / static_cast<double>(sets[0].params),
                  static_cast<double>(sets[i].params) / 1e6, static_cast<double>(sets[0].params) / 1e6, sets[i].depth,
                  sets[0].depth, i + 1 == sets.size() ? "; target >= 30x" : "");
}

}  // namespace

void capacity(const Options& o) {
  stp::Config base = config_with(o, {"memory.device_budget=" + o.budget});
  const std::size_t budget = static_cast<std::size_t>(*base.memory.device_budget);
  const int stages =
      base.parallel.pp *
      (base.parallel.schedule == "stp" || base.parallel.schedule == "zb-v" || base.parallel.schedule == "1f1b-i" ? 2
                                                                                                                 : 1);
  std::printf("\n== capacity: n_embd %lld, %s tp %d pp %d, m %d, micro batch %d, device budget %.1f MiB ==\n",
              static_cast<long long>(base.model.n_embd), base.parallel.schedule.c_str(), base.parallel.tp,
              base.parallel.pp, base.train.microbatches, base.train.micro_batch_size, mib(budget));
  std::vector<LeverSet> sets = lever_sets(o);
  int known = 0;  // the deepest a previous row fits: the rows are monotone
  for (LeverSet& m : sets) {
    if (m.needs && !has_key(o, std::string(m.needs) + "=none")) {
      std::printf("%-18s: n/a (needs %s)\n", m.name, m.needs);
      continue;
    }
    m.levers.push_back("memory.device_budget=" + o.budget);
    std::printf("%s:\n", m.name);
    std::fflush(stdout);
    auto t0 = std::chrono::steady_clock::now();
    const Depth d = largest_depth(o, m.levers, stages, known);
    m.depth = d.layers;
    double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.depth == 0) {
      std::printf("%-18s: not even %d layers fit\n", m.name, stages);
      continue;
    }
    known = m.depth;
    train_row(o, m, d, search_s, budget);
  }
  if (sets.back().depth > 0) print_depth_bound(o, sets.back().levers, stages, sets.back().depth, budget);
  print_ratios(sets);
}

}  // namespace stp::bench_memory
