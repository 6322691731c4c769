#include "profile/memory.h"

#include <algorithm>
#include <set>

namespace stp::profile {

namespace {

// The op span running at time t (the last one started at or before t, if it has not ended).
const Span* op_at(const RankTimeline& rank, double t) {
  auto it = std::upper_bound(rank.ops.begin(), rank.ops.end(), t, [](double x, const Span* s) { return x < s->ts; });
  if (it == rank.ops.begin()) return nullptr;
  const Span* s = *std::prev(it);
  return t < s->end ? s : nullptr;
}

}  // namespace

MemoryReport memory_report(const Trace& trace, const RankTimeline& rank, const StepFilter& filter, int top) {
  MemoryReport r;
  r.has_device = !rank.device_memory.empty();
  r.has_pinned = !rank.pinned_memory.empty();
  for (const Counter* c : rank.pinned_memory) r.peak_pinned = std::max(r.peak_pinned, trace.total(*c));
  const auto& mem = rank.device_memory;
  std::vector<double> total(mem.size());
  for (std::size_t i = 0; i < mem.size(); ++i) {
    total[i] = trace.total(*mem[i]);
    r.peak_device = std::max(r.peak_device, total[i]);
  }
  // Local maxima inside the analysed windows.
  struct Candidate {
    std::size_t i;
    const StepWindow* w;
  };
  std::vector<Candidate> peaks;
  for (const StepWindow& w : rank.steps) {
    if (!filter.covers(w.step)) continue;
    auto lo = std::lower_bound(mem.begin(), mem.end(), w.begin, [](const Counter* c, double t) { return c->ts < t; });
    for (auto it = lo; it != mem.end() && (*it)->ts < w.end; ++it) {
      auto i = static_cast<std::size_t>(it - mem.begin());
      bool rising = i == 0 || total[i] >= total[i - 1];
      bool falling = i + 1 == mem.size() || total[i] > total[i + 1];
      if (rising && falling) peaks.push_back({i, &w});
    }
  }
  std::stable_sort(peaks.begin(), peaks.end(),
                   [&](const Candidate& a, const Candidate& b) { return total[a.i] > total[b.i]; });
  std::set<std::string> ops_seen;
  for (const Candidate& p : peaks) {
    if (static_cast<int>(r.high_water.size()) >= top) break;
    const Counter* c = mem[p.i];
    const Span* op = op_at(rank, c->ts);
    std::string name = op ? trace.str(op->name) : std::string();
    if (!ops_seen.insert(name).second) continue;
    MemoryMoment m;
    m.ts_us = c->ts;
    m.step = p.w->step;
    m.into_step_ms = (c->ts - p.w->begin) * 1e-3;
    m.total = total[p.i];
    m.op = name;
    for (std::uint32_t k = c->begin; k < c->end; ++k)
      m.by_category.emplace_back(trace.str(trace.values[k].first), trace.values[k].second);
    r.high_water.push_back(std::move(m));
  }
  return r;
}

}  // namespace stp::profile
