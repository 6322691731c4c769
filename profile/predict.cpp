#include "profile/predict.h"

#include <algorithm>
#include <map>

#include "profile/overlap.h"

namespace stp::profile {

Prediction predict(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& s, int tp,
                   const StepFilter& filter) {
  Prediction p;
  p.calibration = calibrate(trace, ranks, s, tp, filter);
  p.sim = sched::simulate(s, p.calibration.costs);
  p.makespan.predicted = p.sim.makespan;

  std::map<int, const RankTimeline*> by_pid;
  for (const RankTimeline& r : ranks) by_pid[r.pid] = &r;
  // Makespan per step over every rank.
  std::map<std::int64_t, std::pair<double, double>> extent;  // step -> (first start, last end)
  for (const RankTimeline& r : ranks)
    for (const StepWindow& w : r.steps) {
      if (!filter.covers(w.step)) continue;
      Interval e = pipeline_extent(r, w);
      if (e.b <= e.a) continue;
      auto [it, fresh] = extent.try_emplace(w.step, 1e300, -1e300);
      it->second.first = std::min(it->second.first, e.a);
      it->second.second = std::max(it->second.second, e.b);
    }
  for (auto& [step, e] : extent) p.makespan.measured += (e.second - e.first) * 1e-3;
  if (!extent.empty()) p.makespan.measured /= static_cast<double>(extent.size());

  for (int r = 0; r < s.pp; ++r) {
    RankVersus rp;
    rp.rank = r;
    RankTimes sum;
    int steps = 0;
    for (int t = 0; t < tp; ++t) {
      auto it = by_pid.find(r * tp + t);
      if (it == by_pid.end()) continue;
      RankTimes m = measure(*it->second, filter);
      steps += m.steps;
      sum += m;
    }
    if (steps > 0) {
      double n = steps;
      rp.span.measured = sum.span_ms / n;
      rp.busy.measured = (sum.busy_ms + sum.issue_gap_ms) / n;
      rp.tp_exposed.measured = sum.tp_exposed_ms / n;
      rp.bubble.measured = (sum.bubble_ms - sum.issue_gap_ms) / n;
    }
    const sched::RankStats& st = p.sim.ranks[static_cast<std::size_t>(r)];
    rp.span.predicted = st.span;
    rp.busy.predicted = st.busy;
    rp.tp_exposed.predicted = st.tp_exposed;
    rp.bubble.predicted = st.pp_bubble;
    p.ranks.push_back(rp);
  }
  return p;
}

}  // namespace stp::profile
