#include "profile/timeline.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "base/trace_names.h"

namespace stp::profile {

namespace {

bool by_start(const Span* x, const Span* y) { return x->ts < y->ts || (x->ts == y->ts && x->end > y->end); }

std::int64_t step_number(const std::string& name) {
  // "step 12" -> 12; anything else -> 0
  auto at = name.find_last_of(' ');
  if (at == std::string::npos) return 0;
  return std::strtoll(name.c_str() + at + 1, nullptr, 10);
}

}  // namespace

std::vector<RankTimeline> timelines(const Trace& trace) {
  std::map<int, RankTimeline> by_pid;
  const std::uint32_t device = trace.find(trace::track::kDeviceMemory);
  const std::uint32_t pinned = trace.find(trace::track::kPinnedMemory);
  for (const Span& s : trace.spans) {
    RankTimeline& r = by_pid[s.pid];
    if (s.lane == Lane::Compute) {
      if (s.kind == Kind::Op) r.ops.push_back(&s);
      else if (s.kind == Kind::Step) r.steps.push_back({step_number(trace.str(s.name)), s.ts, s.end});
      else if (s.kind == Kind::F || s.kind == Kind::B || s.kind == Kind::W) r.lanes[0].push_back(&s);
      else r.lanes[static_cast<int>(Lane::Other)].push_back(&s);
    } else {
      r.lanes[static_cast<int>(s.lane)].push_back(&s);
    }
  }
  for (const Counter& c : trace.counters) {
    if (c.track != device && c.track != pinned) continue;
    RankTimeline& r = by_pid[c.pid];
    (c.track == device ? r.device_memory : r.pinned_memory).push_back(&c);
  }
  std::vector<RankTimeline> out;
  for (auto& [pid, r] : by_pid) {
    r.pid = pid;
    for (auto& l : r.lanes) std::stable_sort(l.begin(), l.end(), by_start);
    std::stable_sort(r.ops.begin(), r.ops.end(), by_start);
    std::sort(r.steps.begin(), r.steps.end(),
              [](const StepWindow& a, const StepWindow& b) { return a.begin < b.begin; });
    for (auto* v : {&r.device_memory, &r.pinned_memory})
      std::stable_sort(v->begin(), v->end(), [](const Counter* a, const Counter* b) { return a->ts < b->ts; });
    if (r.steps.empty()) {  // one window over everything the rank did
      double a = 1e300, b = -1e300;
      for (auto& l : r.lanes)
        for (const Span* s : l) a = std::min(a, s->ts), b = std::max(b, s->end);
      for (const Span* s : r.ops) a = std::min(a, s->ts), b = std::max(b, s->end);
      if (a <= b) r.steps.push_back({0, a, b});
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<const Span*> starting_in(const std::vector<const Span*>& v, double a, double b) {
  auto lo = std::lower_bound(v.begin(), v.end(), a, [](const Span* s, double t) { return s->ts < t; });
  std::vector<const Span*> out;
  for (auto it = lo; it != v.end() && (*it)->ts < b; ++it) out.push_back(*it);
  return out;
}

}  // namespace stp::profile
