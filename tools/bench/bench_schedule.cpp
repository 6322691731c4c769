// Benchmark: generate + validate + simulate every schedule at p = 8, m = 256 (target: < 50 ms in total).
// Prints the median of several repeats per schedule, the total, and the cost per op. No options
// (--help, --version).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "schedule/schedule.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"
#include "tools/cli/cli.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Generates, validates and simulates every schedule at p = 8, m = 256 (target: < 50 ms in total) and "
      "the cost per op at m = 64, 256 and 1024.",
      "bench_schedule"};
  stp::tools::init_cli(app);
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  using Clock = std::chrono::steady_clock;
  const int pp = 8, m = 256, repeats = 9;
  stp::sched::Costs costs;
  costs.tar = 0.3;
  costs.tp2p = 0.05;
  double total_ms = 0;
  std::size_t total_ops = 0;
  std::printf("%-8s %8s %12s %12s\n", "schedule", "ops", "median ms", "ns per op");
  for (const std::string& name : stp::sched::schedule_names()) {
    std::vector<double> ms;
    std::size_t n_ops = 0;
    double makespan = 0;
    for (int i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      stp::sched::Schedule s = stp::sched::generate(name, pp, m);
      stp::sched::validate(s);
      stp::sched::SimResult r = stp::sched::simulate(s, costs);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      n_ops = s.n_ops();
      makespan = r.makespan;
    }
    std::sort(ms.begin(), ms.end());
    double med = ms[ms.size() / 2];
    total_ms += med;
    total_ops += n_ops;
    std::printf("%-8s %8zu %12.3f %12.1f   (makespan %.1f)\n", name.c_str(), n_ops, med, med * 1e6 / n_ops, makespan);
  }
  std::printf("total    %8zu %12.3f %12.1f   target < 50 ms: %s\n", total_ops, total_ms, total_ms * 1e6 / total_ops,
              total_ms < 50 ? "ok" : "MISSED");
  // Linearity: the cost per op should not grow with m.
  for (int mm : {64, 256, 1024}) {
    auto t0 = Clock::now();
    std::size_t ops = 0;
    for (const std::string& name : stp::sched::schedule_names()) {
      stp::sched::Schedule s = stp::sched::generate(name, pp, mm);
      stp::sched::validate(s);
      stp::sched::simulate(s, costs);
      ops += s.n_ops();
    }
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("scaling  m = %4d: %7zu ops, %8.3f ms, %6.1f ns per op\n", mm, ops, ms, ms * 1e6 / ops);
  }
  return 0;
}
