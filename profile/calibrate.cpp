#include "profile/calibrate.h"

#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>

#include "base/error.h"
#include "base/trace_names.h"
#include "profile/intervals.h"
#include <cstdio>

namespace stp::profile {

namespace {

struct RankStep {
  const RankTimeline* rank = nullptr;
  StepWindow window;
  std::vector<const Span*> ops, units, ars;
  std::unordered_map<std::string, const Span*> recv_by_name;  // "recv <message>" -> its span
  std::vector<double> lag;                                    // per unit: the issue gap before it (µs)
  std::vector<int> op_of;                                     // per unit: op index (-1: outside every op)
};

// Everything in flight on a rank besides compute: the intervals issue gaps are measured against.
Intervals in_flight(const RankTimeline& r) {
  std::vector<Interval> v;
  for (Lane l : {Lane::TpComm, Lane::P2p, Lane::D2h, Lane::H2d})
    for (const Span* s : r.lane(l)) v.push_back({s->ts, s->end});
  return unite(std::move(v));
}

// The issue gap before each unit: idle compute time since the previous unit with nothing in flight.
void charge_issue_gaps(RankStep& rs, const Intervals& busy_elsewhere) {
  const auto& u = rs.units;
  rs.lag.assign(u.size(), 0.0);
  if (u.empty()) return;
  // The step's first op starts when the rank could start it (after its receives): time from
  // there to its first unit is that op's issue gap, as between any two units.
  double prev_end = rs.ops.empty() ? u[0]->ts : std::min(rs.ops.front()->ts, u[0]->ts);
  for (std::size_t i = 0; i < u.size(); ++i) {
    double a = prev_end, b = u[i]->ts;
    prev_end = std::max(prev_end, u[i]->end);
    if (b > a) rs.lag[i] = std::max(0.0, (b - a) - covered(busy_elsewhere, a, b));
  }
}

void assign_ops(RankStep& rs) {
  rs.op_of.assign(rs.units.size(), -1);
  std::size_t k = 0;
  for (std::size_t i = 0; i < rs.units.size(); ++i) {
    const Span* u = rs.units[i];
    while (k < rs.ops.size() && rs.ops[k]->end <= u->ts) ++k;
    if (k < rs.ops.size() && rs.ops[k]->ts <= u->ts) rs.op_of[i] = static_cast<int>(k);
  }
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

int median(std::vector<int> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Key of a message, to find the op that sends it.
long message_key(const sched::Message& m) { return (static_cast<long>(m.pass) * 4096 + m.from_stage) * 1048576 + m.mb; }

// What the steps contribute to each cost, in µs, before averaging.
struct Samples {
  std::vector<double> f, b, w, ar, p2p;
  std::array<std::vector<double>, sched::kOpShapes> issue;  // per op shape: the group's issue gap per op
  std::vector<int> ars_per_part;
  double d2h_bytes = 0, d2h_us = 0, h2d_bytes = 0, h2d_us = 0;
  int parts = 0;
};

using Group = std::vector<RankStep>;  // one pp rank's TP members in one step

// Units, per op and position j in the op: the slowest member's span, summed per part; the larger
// member's issue gap, summed per op.
void unit_samples(const sched::Schedule& s, int r, const Group& group, Samples& out) {
  const RankStep& lead = group[0];
  std::vector<std::vector<std::vector<std::size_t>>> members(group.size());  // [member][op] -> unit indices
  for (std::size_t t = 0; t < group.size(); ++t) {
    members[t].assign(group[t].ops.size(), {});
    for (std::size_t i = 0; i < group[t].units.size(); ++i)
      if (group[t].op_of[i] >= 0) members[t][static_cast<std::size_t>(group[t].op_of[i])].push_back(i);
  }
  std::map<std::pair<std::size_t, std::uint32_t>, double> f_sum, b_sum, w_sum;  // (op, part) -> µs
  for (std::size_t k = 0; k < lead.ops.size(); ++k) {
    std::size_t n = members[0][k].size();
    for (std::size_t t = 1; t < group.size(); ++t) n = std::min(n, members[t][k].size());
    double op_lag = 0;
    for (std::size_t j = 0; j < n; ++j) {
      double dur = 0, lag = 0;
      for (std::size_t t = 0; t < group.size(); ++t) {
        std::size_t i = members[t][k][j];
        dur = std::max(dur, group[t].units[i]->dur());
        lag = std::max(lag, group[t].lag[i]);
      }
      op_lag += lag;
      const Span* u = lead.units[members[0][k][j]];
      (u->kind == Kind::F ? f_sum : u->kind == Kind::B ? b_sum : w_sum)[{k, u->part}] += dur;
    }
    out.issue[static_cast<std::size_t>(sched::op_shape(s.ranks[r][k]))].push_back(op_lag);
  }
  for (auto& [k, v] : f_sum) out.f.push_back(v);
  for (auto& [k, v] : b_sum) out.b.push_back(v);
  for (auto& [k, v] : w_sum) out.w.push_back(v);
  out.parts += static_cast<int>(f_sum.size() + b_sum.size() + w_sum.size());
}

// All-reduces: the j-th of the step on every member is the same collective; its cost is the
// fastest member's span.
void allreduce_samples(const Group& group, Samples& out) {
  if (group.size() < 2) return;
  std::size_t n = group[0].ars.size();
  for (const RankStep& m : group) n = std::min(n, m.ars.size());
  std::map<std::uint32_t, int> per_part;
  for (std::size_t j = 0; j < n; ++j) {
    double d = group[0].ars[j]->dur();
    for (const RankStep& m : group) d = std::min(d, m.ars[j]->dur());
    out.ar.push_back(d);
    ++per_part[group[0].ars[j]->part];
  }
  for (auto& [p, c] : per_part) out.ars_per_part.push_back(c);
}

// Messages: receive end − end of the producing op, for the last message an op waited for, when
// the consumer was free before the producer had finished.
void message_samples(const sched::Schedule& s, const std::vector<Group>& step,
                     const std::unordered_map<long, std::pair<int, int>>& sender, Samples& out) {
  for (int r = 0; r < s.pp; ++r)
    for (std::size_t t = 0; t < step[static_cast<std::size_t>(r)].size(); ++t) {
      const RankStep& rs = step[static_cast<std::size_t>(r)][t];
      if (rs.recv_by_name.empty()) continue;
      for (std::size_t k = 0; k < rs.ops.size(); ++k) {
        double landed = -1, produced = 0;
        for (const sched::Message& m : sched::op_messages(s, r, s.ranks[r][k]).recv) {
          auto snd = sender.find(message_key(m));
          auto recv = rs.recv_by_name.find(trace::recv_span(sched::to_string(m)));
          if (snd == sender.end() || recv == rs.recv_by_name.end()) continue;
          if (recv->second->end > landed) {
            landed = recv->second->end;
            const RankStep& ps = step[static_cast<std::size_t>(snd->second.first)][t];
            produced = ps.ops[static_cast<std::size_t>(snd->second.second)]->end;
          }
        }
        if (landed < 0) continue;
        double free_at = k > 0 ? rs.ops[k - 1]->end : rs.window.begin;
        if (free_at < produced) out.p2p.push_back(std::max(0.0, landed - produced));
      }
    }
}

}  // namespace

Calibration calibrate(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& s, int tp,
                      const StepFilter& filter) {
  STP_CHECK(tp >= 1, "tp must be at least 1, got ", tp);
  std::map<int, const RankTimeline*> by_pid;
  for (const RankTimeline& r : ranks) by_pid[r.pid] = &r;
  for (int g = 0; g < s.pp * tp; ++g)
    STP_CHECK(by_pid.count(g), "the trace has no spans of rank ", g, " but the run has pp ", s.pp, " x tp ", tp, " = ",
              s.pp * tp, " ranks: is config.yaml the config of this run?");
  // Which op of which pp rank sends each message.
  std::unordered_map<long, std::pair<int, int>> sender;  // key -> (pp rank, op index)
  for (int r = 0; r < s.pp; ++r)
    for (std::size_t k = 0; k < s.ranks[r].size(); ++k)
      for (const sched::Message& m : sched::op_messages(s, r, s.ranks[r][k]).send)
        sender[message_key(m)] = {r, static_cast<int>(k)};
  std::unordered_map<int, Intervals> busy_elsewhere;
  for (const auto& [pid, r] : by_pid) busy_elsewhere[pid] = in_flight(*r);

  Samples sm;
  Calibration out;
  for (const StepWindow& w0 : by_pid.at(0)->steps) {
    if (!filter.covers(w0.step)) continue;
    // This step on every rank: [pp rank][tp rank]; skipped unless every rank has it.
    std::vector<Group> step(static_cast<std::size_t>(s.pp), Group(static_cast<std::size_t>(tp)));
    bool complete = true;
    for (int r = 0; r < s.pp && complete; ++r)
      for (int t = 0; t < tp && complete; ++t) {
        const RankTimeline& rt = *by_pid.at(r * tp + t);
        auto w = std::find_if(rt.steps.begin(), rt.steps.end(), [&](const StepWindow& x) { return x.step == w0.step; });
        if (w == rt.steps.end()) {
          complete = false;
          break;
        }
        RankStep& rs = step[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        rs.rank = &rt;
        rs.window = *w;
        rs.ops = starting_in(rt.ops, w->begin, w->end);
        rs.units = starting_in(rt.units(), w->begin, w->end);
        rs.ars = starting_in(rt.lane(Lane::TpComm), w->begin, w->end);
        for (const Span* p : starting_in(rt.lane(Lane::P2p), w->begin, w->end))
          rs.recv_by_name.emplace(trace.str(p->name), p);
        STP_CHECK(rs.ops.size() == s.ranks[r].size(), "rank ", rt.pid, " ran ", rs.ops.size(), " ops in step ", w->step,
                  " but schedule ", s.name, " (pp ", s.pp, ", microbatches ", s.microbatches, ") gives pp rank ", r,
                  " ", s.ranks[r].size(), ": the trace is not of this schedule");
        charge_issue_gaps(rs, busy_elsewhere.at(rt.pid));
        assign_ops(rs);
        for (const Span* c : starting_in(rt.lane(Lane::D2h), w->begin, w->end))
          if (c->bytes > 0) sm.d2h_bytes += c->bytes, sm.d2h_us += c->dur();
        for (const Span* c : starting_in(rt.lane(Lane::H2d), w->begin, w->end))
          if (c->bytes > 0) sm.h2d_bytes += c->bytes, sm.h2d_us += c->dur();
      }
    if (!complete) continue;
    ++out.steps;
    for (int r = 0; r < s.pp; ++r) {
      unit_samples(s, r, step[static_cast<std::size_t>(r)], sm);
      allreduce_samples(step[static_cast<std::size_t>(r)], sm);
    }
    message_samples(s, step, sender, sm);
  }
  constexpr double ms = 1e-3;
  out.parts = sm.parts;
  out.all_reduces = static_cast<int>(sm.ar.size());
  out.messages = static_cast<int>(sm.p2p.size());
  out.costs.tf = mean(sm.f) * ms;
  out.costs.tb = mean(sm.b) * ms;
  out.costs.tw = mean(sm.w) * ms;
  out.costs.units = sm.ar.empty() ? 2 : std::max(1, median(sm.ars_per_part));
  out.costs.tar = mean(sm.ar) * ms * out.costs.units;
  out.costs.tp2p = mean(sm.p2p) * ms;
  // Issue overhead per op shape; a shape the run never ran gets the sum over its parts of the
  // overhead of plain ops of those passes (F, B or B*, W), so `stp sim` of another schedule has one.
  for (std::size_t k = 0; k < sched::kOpShapes; ++k) {
    out.issue_samples[k] = static_cast<int>(sm.issue[k].size());
    out.costs.issue[k] = mean(sm.issue[k]) * ms;
  }
  auto measured = [&](int k) { return !sm.issue[static_cast<std::size_t>(k)].empty(); };
  auto plain = [&](int k, int alt) {
    if (measured(k)) return out.costs.issue[static_cast<std::size_t>(k)];
    return measured(alt) ? out.costs.issue[static_cast<std::size_t>(alt)] : 0.0;
  };
  const double f = plain(0, 0), b = plain(1, 2), bd = plain(2, 1), w = plain(3, 3);
  const double fallback[sched::kOpShapes] = {f, b, bd, w, f + b, f + bd, f + w, 2 * f};
  for (int k = 0; k < sched::kOpShapes; ++k)
    if (!measured(k)) out.costs.issue[static_cast<std::size_t>(k)] = fallback[k];
  out.d2h_gbps = sm.d2h_us > 0 ? sm.d2h_bytes / (sm.d2h_us * 1e3) : 0;
  out.h2d_gbps = sm.h2d_us > 0 ? sm.h2d_bytes / (sm.h2d_us * 1e3) : 0;
  return out;
}

std::string sim_flags(const sched::Costs& c) {
  auto f = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return std::string(buf);
  };
  std::string issue;
  for (int k = 0; k < sched::kOpShapes; ++k)
    if (c.issue[static_cast<std::size_t>(k)] > 0)
      issue += str(issue.empty() ? "" : ",", sched::op_shape_name(k), "=", f(c.issue[static_cast<std::size_t>(k)]));
  return str("--tf ", f(c.tf), " --tb ", f(c.tb), " --tw ", f(c.tw), " --tar ", f(c.tar), " --tp2p ", f(c.tp2p),
             " --units ", c.units, issue.empty() ? std::string() : " --issue '" + issue + "'");
}

}  // namespace stp::profile
