// Part 3 of bench_memory: the optimizer offload's cost and the optimizer overlap.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/bench_memory/parts.h"
#include "tools/bench/bench_memory/step_runs.h"
#include "train/memory_planning.h"

namespace stp::bench_memory {

namespace {

// The plan's peak, how many chunks keep their optimizer on the host, and the predicted optimizer
// offload time against the compute (the slowest device's of each).
void print_optimizer_plan(const stp::MemoryPlan& plan) {
  std::size_t host = 0, chunks = 0;
  for (const auto& rp : plan.ranks)
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch, ++chunks)
      host += rp.optimizer_placement(static_cast<int>(ch)) == stp::OptimizerPlacement::Host;
  double predicted = 0, compute = 0;
  for (const auto& p : plan.predicted)
    predicted = std::max(predicted, p.optimizer_offload_s), compute = std::max(compute, p.compute_s);
  std::printf(
      "plan: peak %.2f MiB; optimizer of %zu of %zu chunks on the host; predicted optimizer offload %.1f ms "
      "(copies + CPU AdamW, counted exposed) over %.1f ms compute\n",
      mib(max_peak(plan)), host, chunks, predicted * 1e3, compute * 1e3);
}

}  // namespace

// Part 3 (see the header): the optimizer leaves the device, activation levers off.
void optimizer_cost(const Options& o) {
  const std::string engine = "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus);
  const std::vector<std::string> levers_off = {"memory.offload=none", "memory.recompute=none", engine};
  std::vector<std::string> x = levers_off;
  x.push_back("memory.optimizer_offload=none");
  const stp::Config plain = config_with(o, x);
  stp::MemoryPlan free_plan;
  fits(plain, &free_plan);
  const std::size_t peak = max_peak(free_plan);
  std::size_t optimizer = 0;
  for (const auto& p : free_plan.predicted)
    if (p.peak_device_bytes == peak) optimizer = std::max(optimizer, p.optimizer_device_bytes);
  // The exact minimum with every chunk's optimizer on the host and on the device (the allocator
  // needs a little more than the live peak): a budget between them forces state off the device.
  auto minimum = [&](const char* placement) {
    std::vector<std::string> y = levers_off;
    y.insert(y.end(), {std::string("memory.optimizer_offload=") + placement, "memory.device_budget=1MiB"});
    return stp::make_memory_plan(config_with(o, y), /*exact_minimum=*/true).min_device_budget;
  };
  const std::size_t on_host = minimum("all"), on_device = minimum("none");
  const std::size_t budget = std::max(peak - optimizer / 2, on_host);
  if (budget >= on_device) {
    std::printf(
        "\n== optimizer cost: every budget that fits the optimizer on the host (%.2f MiB) fits it on the "
        "device (%.2f MiB): no cost to measure ==\n",
        mib(on_host), mib(on_device));
    return;
  }
  x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=auto", "memory.device_budget=" + std::to_string(budget)});
  const stp::Config offloaded = config_with(o, x);
  std::printf(
      "\n== optimizer cost: n_layer %lld, %s tp %d pp %d, copy-engine CPUs %d, unconstrained peak %.2f MiB, "
      "optimizer state %.2f MiB on the largest device, budget %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, o.copy_cpus, mib(peak), mib(optimizer), mib(budget));
  stp::MemoryPlan plan;
  if (!fits(offloaded, &plan)) {
    std::printf("the planner finds no plan (minimum feasible %.2f MiB): no cost to measure\n",
                mib(plan.min_device_budget));
    return;
  }
  print_optimizer_plan(plan);
  std::vector<double> ratios, plain_ms, offloaded_ms;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), b = run_steps(offloaded, o.steps);
    plain_ms.push_back(a.step_ms), offloaded_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf("pair %d: unconstrained %.1f ms/step, optimizer offloaded %.1f ms/step, ratio %.3f\n", i + 1, a.step_ms,
                b.step_ms, b.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  const double r = median(ratios);
  std::printf(
      "optimizer cost ratio: %.3fx (median of %d pairs, spread %.3f..%.3f; unconstrained %.1f ms, offloaded %.1f "
      "ms); target <= 1.15x: %s\n",
      r, o.pairs, *lo, *hi, median(plain_ms), median(offloaded_ms), r <= 1.15 ? "met" : "MISSED");
}

// Part 3b (see the header): every optimizer on the host, overlap none against all.
void overlap_cost(const Options& o) {
  auto with = [&](const char* overlap) {
    return config_with(o, {"memory.offload=none", "memory.recompute=none", "memory.optimizer_offload=all",
                           "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus),
                           std::string("memory.optimizer_overlap=") + overlap});
  };
  const stp::Config none = with("none"), all = with("all");
  stp::MemoryPlan none_plan, all_plan;
  if (!fits(none, &none_plan) || !fits(all, &all_plan)) {
    std::printf("\n== optimizer overlap: the job does not fit with every optimizer on the host ==\n");
    return;
  }
  // Per device: the tied embedding's chunks do not speculate, so the devices holding them keep
  // their exposed time.
  std::string exposed;
  std::size_t shadows = 0;
  for (std::size_t g = 0; g < all_plan.predicted.size(); ++g) {
    const stp::RankPrediction& p = all_plan.predicted[g];
    shadows += p.optimizer_shadow_bytes;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.1f -> %.1f", g ? ", " : "", none_plan.predicted[g].optimizer_offload_s * 1e3,
                  p.optimizer_offload_s * 1e3);
    exposed += buf;
  }
  std::printf(
      "\n== optimizer overlap: n_layer %lld, %s tp %d pp %d, every optimizer on the host, copy-engine CPUs %d, "
      "grad_clip %g; shadows %.2f MiB pinned in all; predicted exposed optimizer time per device, none -> all: "
      "%s ms ==\n",
      static_cast<long long>(none.model.n_layer), none.parallel.schedule.c_str(), none.parallel.tp, none.parallel.pp,
      o.copy_cpus, none.train.grad_clip, mib(shadows), exposed.c_str());
  std::vector<double> ratios, none_ms, all_ms;
  stp::StepResult::Speculation spec;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(none, o.steps), b = run_steps(all, o.steps, &spec);
    none_ms.push_back(a.step_ms), all_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf("pair %d: overlap none %.1f ms/step, overlap all %.1f ms/step, ratio %.3f\n", i + 1, a.step_ms,
                b.step_ms, b.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf(
      "overlap ratio (all / none): %.3fx (median of %d pairs, spread %.3f..%.3f; none %.1f ms, all %.1f ms); "
      "speculations: %llu committed, %llu discarded, %.1f ms of CPU update hidden per measured step\n",
      median(ratios), o.pairs, *lo, *hi, median(none_ms), median(all_ms),
      static_cast<unsigned long long>(spec.committed), static_cast<unsigned long long>(spec.discarded),
      spec.hidden_s * 1e3 / std::max(1, o.pairs * o.steps));
}

}  // namespace stp::bench_memory
