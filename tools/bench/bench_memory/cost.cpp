// Part 2 of bench_memory: the activation levers' cost at 60% of the unconstrained peak.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/bench_memory/parts.h"
#include "tools/bench/bench_memory/step_runs.h"

namespace stp::bench_memory {

void cost(const Options& o) {
  stp::MemoryPlan free_plan;
  // Both runs of a pair get the same compute CPUs: with an emulated copy engine (the last
  // copy_cpus CPUs run only D2H/H2D) copies contend with compute as little as a GPU's DMA engines.
  const std::string engine = "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus);
  stp::Config plain = config_with(o, {"memory.offload=none", "memory.recompute=none", engine});
  fits(plain, &free_plan);
  const std::size_t peak = max_peak(free_plan);
  const std::size_t budget = peak * 6 / 10;
  stp::Config planned = config_with(
      o, {"memory.offload=auto", "memory.recompute=auto", engine, "memory.device_budget=" + std::to_string(budget)});
  std::printf(
      "\n== cost: n_layer %lld, %s tp %d pp %d, link %.2f GB/s, copy-engine CPUs %d, unconstrained peak %.2f MiB, "
      "budget 60%% = %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, planned.memory.link_bandwidth / 1e9, o.copy_cpus, mib(peak), mib(budget));
  stp::MemoryPlan plan;
  if (!fits(planned, &plan)) {
    std::printf("the planner finds no plan for 60%% (minimum feasible %.2f MiB): no cost to measure\n",
                mib(plan.min_device_budget));
    return;
  }
  double exposed = 0, recompute = 0, compute = 0;
  std::uint64_t offload = 0;
  for (const auto& p : plan.predicted) {
    exposed = std::max(exposed, p.exposed_copy_s);
    recompute = std::max(recompute, p.recompute_s);
    compute = std::max(compute, p.compute_s);
    offload = std::max(offload, p.offload_bytes_per_step);
  }
  std::printf(
      "plan: predicted peak %.2f MiB; per device at most %.1f MiB offloaded/step, predicted exposed copy %.1f ms, "
      "recompute %.1f ms over %.1f ms compute -> copies %s\n%s",
      mib(max_peak(plan)), mib(offload), exposed * 1e3, recompute * 1e3, compute * 1e3,
      exposed == 0 ? "fit under compute" : "do NOT fit under compute", plan.summary.c_str());
  std::vector<double> ratios, plain_ms, planned_ms;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), b = run_steps(planned, o.steps);
    plain_ms.push_back(a.step_ms), planned_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf(
        "pair %d: unconstrained %.1f ms/step, planned %.1f ms/step (copy streams busy %.1f ms, compute "
        "stalled on reloads %.2f ms), ratio %.3f\n",
        i + 1, a.step_ms, b.step_ms, b.copy_ms, b.stall_ms, b.step_ms / a.step_ms);
  }
  std::printf("cost ratio: %.3fx (median of %d pairs; unconstrained %.1f ms, planned %.1f ms; target <= 1.10x %s)\n",
              median(ratios), o.pairs, median(plain_ms), median(planned_ms),
              exposed == 0 ? "applies: copies predicted to fit" : "does not apply: copies predicted exposed");
}

}  // namespace stp::bench_memory
