// Part 4 of bench_memory: the step cost at a budget that forces parameter streaming.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/bench_memory/parts.h"
#include "tools/bench/bench_memory/step_runs.h"
#include "train/memory_planning.h"

namespace stp::bench_memory {

namespace {

// Part 4 (see the header): a budget that only parameter streaming fits, against no levers.
struct StreamBudgets {
  std::size_t streaming = 0, resident = 0;  // exact minimum feasible budgets, param_offload all / none
};

StreamBudgets stream_budgets(const Options& o, const std::vector<std::string>& levers_off) {
  auto minimum = [&](const char* stream) {
    std::vector<std::string> y = levers_off;
    y.insert(y.end(), {"memory.optimizer_offload=all", std::string("memory.param_offload=") + stream,
                       "memory.device_budget=1MiB"});
    return stp::make_memory_plan(config_with(o, y), /*exact_minimum=*/true).min_device_budget;
  };
  return {minimum("all"), minimum("none")};
}

// The plan's step time: the slowest device's compute plus what the levers add to it.
double predicted_step_s(const stp::MemoryPlan& plan) {
  double s = 0;
  for (const auto& p : plan.predicted) s = std::max(s, p.compute_s + p.step_cost_s());
  return s;
}

void print_stream_plan(const stp::MemoryPlan& plan, const stp::MemoryPlan& free_plan) {
  std::size_t streamed = 0, chunks = 0;
  for (const auto& rp : plan.ranks)
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch, ++chunks) streamed += rp.streams_params(static_cast<int>(ch));
  std::printf("plan: peak %.2f MiB; weights and gradients of %zu of %zu chunks streamed; per device, ms per step:\n",
              mib(max_peak(plan)), streamed, chunks);
  for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
    const stp::RankPrediction& p = plan.predicted[g];
    std::printf(
        "  device %zu: streamed %.2f MiB weights up, %.2f MiB gradients up, %.2f MiB down; compute %.1f, exposed "
        "copies %.1f, optimizer offload %.1f (CPU AdamW %.1f) -> step %.1f\n",
        g, mib(p.stream_weights_up_bytes), mib(p.stream_grads_up_bytes), mib(p.stream_grads_down_bytes),
        p.compute_s * 1e3, p.exposed_copy_s * 1e3, p.optimizer_offload_s * 1e3, p.cpu_optimizer_s * 1e3,
        (p.compute_s + p.step_cost_s()) * 1e3);
  }
  std::printf("predicted step: unconstrained %.1f ms, streaming %.1f ms, ratio %.3f (nominal rates: %s)\n",
              predicted_step_s(free_plan) * 1e3, predicted_step_s(plan) * 1e3,
              predicted_step_s(plan) / predicted_step_s(free_plan),
              "train/planner_rates.h; on the CPU backend the compute is slower than nominal");
}

}  // namespace

void stream_cost(const Options& o) {
  std::vector<std::string> levers_off = {"memory.offload=none", "memory.recompute=none",
                                         "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus)};
  if (o.stream_layers > 0) levers_off.push_back("model.n_layer=" + std::to_string(o.stream_layers));
  const StreamBudgets b = stream_budgets(o, levers_off);
  std::vector<std::string> x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=none", "memory.param_offload=none"});
  const stp::Config plain = config_with(o, x);
  std::printf(
      "\n== streaming cost: n_layer %lld, %s tp %d pp %d, link %.2f GB/s, copy-engine CPUs %d; activation levers off, "
      "every optimizer on the host: minimum feasible budget without streaming %.2f MiB, with it %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, plain.memory.link_bandwidth / 1e9, o.copy_cpus, mib(b.resident), mib(b.streaming));
  if (b.streaming >= b.resident) {
    std::printf("no budget needs streaming: every budget that fits with it fits without (raise --stream-layers)\n");
    return;
  }
  const std::size_t budget = b.streaming + (b.resident - b.streaming) / 2;
  x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=all", "memory.param_offload=auto",
                     "memory.device_budget=" + std::to_string(budget)});
  const stp::Config streaming = config_with(o, x);
  stp::MemoryPlan plan, free_plan;
  fits(plain, &free_plan);
  const auto streams = [](const stp::RankPlan& rp) { return rp.streams_any(); };
  if (!fits(streaming, &plan) || std::none_of(plan.ranks.begin(), plan.ranks.end(), streams)) {
    std::printf("the plan at %.2f MiB does not stream (feasible %d): nothing to measure\n", mib(budget), plan.feasible);
    return;
  }
  std::printf("budget %.2f MiB: halfway between them (streaming needed below %.2f MiB); unconstrained peak %.2f MiB\n",
              mib(budget), mib(b.resident), mib(max_peak(free_plan)));
  print_stream_plan(plan, free_plan);
  std::vector<double> ratios, plain_ms, stream_ms, cpu_ratios;
  bool peaks = true, bytes = true;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), s = run_steps(streaming, o.steps);
    plain_ms.push_back(a.step_ms), stream_ms.push_back(s.step_ms), ratios.push_back(s.step_ms / a.step_ms);
    peaks = peaks && s.peaks_equal, bytes = bytes && s.stream_bytes_equal;
    cpu_ratios.push_back(s.cpu_ms / a.cpu_ms);
    std::printf(
        "pair %d: unconstrained %.1f ms/step (CPU %.0f ms), streaming %.1f ms/step (CPU %.0f ms; %.2f MiB in %llu "
        "copies streamed on the busiest device, %s the plan; peaks %s the plan), ratio %.3f\n",
        i + 1, a.step_ms, a.cpu_ms, s.step_ms, s.cpu_ms, mib(s.stream_bytes),
        static_cast<unsigned long long>(s.stream_copies),
        s.stream_bytes_equal ? "=" : "!=", s.peaks_equal ? "=" : "!=", s.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf(
      "streaming cost ratio: %.3fx (median of %d pairs, spread %.3f..%.3f; unconstrained %.1f ms, streaming %.1f ms, "
      "%+.1f ms measured against %+.1f ms predicted); CPU time per step ratio %.3fx (median); measured peaks %s, "
      "streamed bytes %s\n",
      median(ratios), o.pairs, *lo, *hi, median(plain_ms), median(stream_ms), median(stream_ms) - median(plain_ms),
      (predicted_step_s(plan) - predicted_step_s(free_plan)) * 1e3, median(cpu_ratios), peaks ? "= plan" : "!= PLAN",
      bytes ? "= plan" : "!= PLAN");
}

}  // namespace stp::bench_memory
