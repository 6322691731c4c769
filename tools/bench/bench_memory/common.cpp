#include "tools/bench/bench_memory/common.h"

#include <algorithm>

#include "base/error.h"
#include "train/memory_planning.h"

namespace stp::bench_memory {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double mib(std::size_t b) { return static_cast<double>(b) / (1 << 20); }

std::size_t max_peak(const stp::MemoryPlan& plan) {
  std::size_t p = 0;
  for (const auto& r : plan.predicted) p = std::max(p, r.peak_device_bytes);
  return p;
}

stp::Config config_with(const Options& o, std::vector<std::string> extra) {
  std::vector<std::string> all = o.overrides;
  all.insert(all.end(), {"output.trace=false", "output.dir=runs/bench-memory", "memory.link_bandwidth=" + o.link});
  all.insert(all.end(), extra.begin(), extra.end());
  return stp::load_config(o.config, all);
}

bool fits(const stp::Config& c, stp::MemoryPlan* out) {
  stp::MemoryPlan plan = stp::make_memory_plan(c);
  if (out) *out = plan;
  try {
    stp::check_plan(plan, c);
    return true;
  } catch (const stp::Error&) {
    return false;
  }
}

}  // namespace stp::bench_memory
