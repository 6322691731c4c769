#include "profile/overlap.h"

#include <algorithm>

#include "profile/intervals.h"

namespace stp::profile {

namespace {

Intervals spans_of(const std::vector<const Span*>& v, double a, double b) {
  std::vector<Interval> out;
  for (const Span* s : starting_in(v, a, b)) out.push_back({s->ts, std::min(s->end, b)});
  return unite(std::move(out));
}

double bytes_of(const std::vector<const Span*>& v, double a, double b) {
  double t = 0;
  for (const Span* s : starting_in(v, a, b)) t += std::max(0.0, s->bytes);
  return t;
}

}  // namespace

Interval pipeline_extent(const RankTimeline& rank, const StepWindow& w) {
  auto units = starting_in(rank.units(), w.begin, w.end);
  if (units.empty()) return {0, 0};
  Interval e{units.front()->ts, units.front()->end};
  for (const Span* u : units) e.b = std::max(e.b, std::min(u->end, w.end));
  auto ops = starting_in(rank.ops, w.begin, w.end);
  if (!ops.empty()) e.a = std::min(e.a, ops.front()->ts);
  for (const Span* op : ops) e.b = std::max(e.b, std::min(op->end, w.end));
  return e;
}

RankTimes& RankTimes::operator+=(const RankTimes& o) {
  step_ms += o.step_ms, span_ms += o.span_ms, busy_ms += o.busy_ms;
  tp_ms += o.tp_ms, tp_exposed_ms += o.tp_exposed_ms, p2p_ms += o.p2p_ms, p2p_exposed_ms += o.p2p_exposed_ms;
  bubble_ms += o.bubble_ms, p2p_wait_ms += o.p2p_wait_ms, copy_stall_ms += o.copy_stall_ms,
      issue_gap_ms += o.issue_gap_ms;
  d2h_bytes += o.d2h_bytes, h2d_bytes += o.h2d_bytes, d2h_ms += o.d2h_ms, h2d_ms += o.h2d_ms;
  copy_ms += o.copy_ms, copy_hidden_ms += o.copy_hidden_ms;
  for (int l = 0; l < kLanes; ++l)
    lane_busy_ms[static_cast<std::size_t>(l)] += o.lane_busy_ms[static_cast<std::size_t>(l)];
  return *this;
}

RankTimes measure(const RankTimeline& rank, const StepFilter& filter) {
  RankTimes m;
  m.pid = rank.pid;
  constexpr double ms = 1e-3;  // spans are in µs
  for (const StepWindow& w : rank.steps) {
    if (!filter.covers(w.step)) continue;
    ++m.steps;
    m.step_ms += (w.end - w.begin) * ms;
    Intervals lane[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      lane[l] = spans_of(rank.lanes[l], w.begin, w.end);
      m.lane_busy_ms[static_cast<std::size_t>(l)] += length(lane[l]) * ms;
    }
    const Intervals& compute = lane[static_cast<int>(Lane::Compute)];
    const Intervals& tp = lane[static_cast<int>(Lane::TpComm)];
    const Intervals& p2p = lane[static_cast<int>(Lane::P2p)];
    const Intervals copies = unite(lane[static_cast<int>(Lane::D2h)], lane[static_cast<int>(Lane::H2d)]);
    m.tp_ms += length(tp) * ms;
    m.p2p_ms += length(p2p) * ms;
    m.d2h_ms += length(lane[static_cast<int>(Lane::D2h)]) * ms;
    m.h2d_ms += length(lane[static_cast<int>(Lane::H2d)]) * ms;
    m.d2h_bytes += bytes_of(rank.lane(Lane::D2h), w.begin, w.end);
    m.h2d_bytes += bytes_of(rank.lane(Lane::H2d), w.begin, w.end);
    m.copy_ms += length(copies) * ms;
    m.copy_hidden_ms += length(intersect(copies, compute)) * ms;
    if (compute.empty()) continue;
    const Interval extent = pipeline_extent(rank, w);
    const double a = extent.a, b = extent.b;
    const Intervals idle = subtract({{a, b}}, compute);
    const Intervals idle_no_tp = subtract(idle, tp);
    const Intervals idle_no_comm = subtract(idle_no_tp, p2p);
    const Intervals idle_nothing = subtract(idle_no_comm, copies);
    m.span_ms += (b - a) * ms;
    m.busy_ms += length(compute) * ms;
    m.tp_exposed_ms += (length(idle) - length(idle_no_tp)) * ms;
    m.p2p_exposed_ms += length(intersect(idle, p2p)) * ms;
    m.bubble_ms += length(idle_no_tp) * ms;
    m.p2p_wait_ms += (length(idle_no_tp) - length(idle_no_comm)) * ms;
    m.copy_stall_ms += (length(idle_no_comm) - length(idle_nothing)) * ms;
    m.issue_gap_ms += length(idle_nothing) * ms;
  }
  return m;
}

}  // namespace stp::profile
