#include "tools/bench/bench_memory/capacity_search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "train/memory_planning.h"

namespace stp::bench_memory {

std::vector<std::string> strongest_levers(const std::vector<std::string>& levers) {
  static const std::set<std::string> kForceable = {"memory.offload", "memory.recompute", "memory.optimizer_offload",
                                                   "memory.param_offload"};
  std::vector<std::string> out;
  bool forced = false;
  for (const std::string& l : levers) {
    const std::string key = l.substr(0, l.find('='));
    if (kForceable.count(key) && l.substr(key.size()) == "=auto") {
      out.push_back(key + (key == "memory.recompute" ? "=full" : "=all"));
      forced = true;
    } else {
      out.push_back(l);
    }
  }
  return forced ? out : std::vector<std::string>{};
}

Probe probe(const Options& o, const std::vector<std::string>& levers, int layers, bool strongest) {
  std::vector<std::string> x = levers;
  x.push_back("model.n_layer=" + std::to_string(layers));
  const auto t0 = std::chrono::steady_clock::now();
  Probe p;
  const stp::Config c = config_with(o, x);
  if (strongest) {
    p.plan = stp::make_memory_plan(c, /*exact_minimum=*/true);
    const std::size_t budget = static_cast<std::size_t>(*c.memory.device_budget);
    p.fits = p.plan.feasible || max_peak(p.plan) <= budget;
    p.places = p.plan.min_device_budget <= budget;
  } else {
    p.fits = fits(c, &p.plan);
  }
  const char* verdict = strongest ? (p.fits ? (p.places ? "places," : "live fits,") : "live over,")
                                  : (p.fits ? "fits," : "does not fit,");
  std::printf("  probe %-9s n_layer %4d: %-13s peak %6.2f MiB, minimum budget %6.2f MiB (%.1f s)\n",
              strongest ? "strongest" : "planner", layers, verdict, mib(max_peak(p.plan)),
              mib(p.plan.min_device_budget),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
  return p;
}

Depth largest_depth(const Options& o, const std::vector<std::string>& levers, int step, int known) {
  const int cap = std::max(step, o.max_layers / step * step);
  const std::vector<std::string> strongest = strongest_levers(levers);
  std::map<int, Probe> planner, strong;  // probes by depth
  auto plan = [&](int layers) -> const Probe& {
    auto it = planner.find(layers);
    if (it == planner.end()) it = planner.emplace(layers, probe(o, levers, layers, false)).first;
    return it->second;
  };
  auto bound = [&](int layers) -> const Probe& {
    if (strongest.empty()) return plan(layers);
    auto it = strong.find(layers);
    if (it == strong.end()) it = strong.emplace(layers, probe(o, strongest, layers, true)).first;
    return it->second;
  };
  // The largest depth in (lo, hi) where `ok` holds, lo holding (or 0) and hi not: bisection.
  auto bisect = [&](int lo, int hi, auto ok) {
    while (hi - lo > step) {
      const int mid = (lo + hi) / 2 / step * step;
      (ok(mid) ? lo : hi) = mid;
    }
    return lo;
  };
  int top = known;
  if (top == 0) {
    if (!bound(step).fits) return {};
    top = step;
  }
  int over = cap + step;  // the smallest depth over the upper bound (cap + step: beyond the search)
  for (int d = 2 * top; d <= cap; d *= 2) {
    if (!bound(d).fits) {
      over = d;
      break;
    }
    top = d;
  }
  top = bisect(top, over, [&](int d) { return bound(d).fits; });
  int sure = known;         // the planner fits here (the lower bound) ...
  int unsure = top + step;  // ... and may not from here on
  if (strongest.empty()) sure = top;
  for (const auto& [d, p] : strong)
    if (d <= top && p.places) sure = std::max(sure, d);
  for (const auto& [d, p] : strong)
    if (d > sure && !p.places) unsure = std::min(unsure, d);
  sure = bisect(sure, unsure, [&](int d) { return bound(d).places; });
  int lo = bisect(sure, top + step, [&](int d) { return plan(d).fits; });
  if (lo > 0 && lo == sure && !planner.count(lo)) {  // no planner probe here: the strongest plan places
    const auto it = strong.find(lo);
    if (it != strong.end() && it->second.places && it->second.plan.feasible) {
      std::printf(
          "  n_layer %d: the strongest plan places in the budget (so the planner's fits too); the step "
          "trains the strongest plan\n",
          lo);
      return {lo, it->second.plan};
    }
  }
  if (lo > 0 && !plan(lo).fits) {  // a bound's depth, unprobed until now, does not fit the planner
    std::printf("  the planner does not fit n_layer %d: searching below it\n", lo);
    lo = bisect(0, lo, [&](int d) { return plan(d).fits; });
  }
  if (lo == 0) return {};
  return {lo, plan(lo).plan};
}

}  // namespace stp::bench_memory
