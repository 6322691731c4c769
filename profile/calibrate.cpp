#include "profile/calibrate.h"

#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "profile/intervals.h"
#include <cstdio>

namespace stp::profile {

namespace {

struct RankStep {
  const RankTimeline* rank = nullptr;
  StepWindow window;
  std::vector<const Span*> ops, units, ars, recvs;
  std::unordered_map<std::string, const Span*> recv_by_name;  // "recv <message>" -> its span
  std::vector<double> lag;        // per unit: the issue gap before it (µs)
  std::vector<int> op_of;         // per unit: op index (-1: outside every op)
};

// Everything in flight on a rank besides compute: the intervals issue gaps are measured against.
Intervals in_flight(const RankTimeline& r) {
  std::vector<Interval> v;
  for (Lane l : {Lane::TpComm, Lane::P2P, Lane::D2H, Lane::H2D})
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

}  // namespace

Calibration calibrate(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& s, int tp,
                      const StepFilter& filter) {
  STP_CHECK(tp >= 1, "tp must be at least 1, got ", tp);
  std::map<int, const RankTimeline*> by_pid;
  for (const RankTimeline& r : ranks) by_pid[r.pid] = &r;
  for (int g = 0; g < s.pp * tp; ++g)
    STP_CHECK(by_pid.count(g), "the trace has no spans of rank ", g, " but the run has pp ", s.pp, " x tp ", tp,
              " = ", s.pp * tp, " ranks: is config.yaml the config of this run?");
  // Which op of which pp rank sends each message.
  std::unordered_map<long, std::pair<int, int>> sender;  // key -> (pp rank, op index)
  for (int r = 0; r < s.pp; ++r)
    for (std::size_t k = 0; k < s.ranks[r].size(); ++k)
      for (const sched::Message& m : sched::op_messages(s, r, s.ranks[r][k]).send)
        sender[message_key(m)] = {r, static_cast<int>(k)};
  std::unordered_map<int, Intervals> busy_elsewhere;
  for (const auto& [pid, r] : by_pid) busy_elsewhere[pid] = in_flight(*r);

  std::vector<double> f_cost, b_cost, w_cost, ar_cost, p2p_cost;
  std::array<std::vector<double>, sched::kOpShapes> issue;  // per op shape: the group's issue gaps per op
  std::vector<int> ars_per_part;
  double d2h_bytes = 0, d2h_us = 0, h2d_bytes = 0, h2d_us = 0;
  Calibration out;
  for (const StepWindow& w0 : by_pid.at(0)->steps) {
    if (!filter.covers(w0.step)) continue;
    // This step on every rank: [pp rank][tp rank].
    std::vector<std::vector<RankStep>> step(static_cast<std::size_t>(s.pp), std::vector<RankStep>(static_cast<std::size_t>(tp)));
    bool complete = true;
    for (int r = 0; r < s.pp && complete; ++r)
      for (int t = 0; t < tp; ++t) {
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
        rs.recvs = starting_in(rt.lane(Lane::P2P), w->begin, w->end);
        for (const Span* p : rs.recvs) rs.recv_by_name.emplace(trace.str(p->name), p);
        STP_CHECK(rs.ops.size() == s.ranks[r].size(), "rank ", rt.pid, " ran ", rs.ops.size(), " ops in step ", w->step,
                  " but schedule ", s.name, " (pp ", s.pp, ", microbatches ", s.microbatches, ") gives pp rank ", r, " ",
                  s.ranks[r].size(), ": the trace is not of this schedule");
        charge_issue_gaps(rs, busy_elsewhere.at(rt.pid));
        assign_ops(rs);
        for (const Span* c : starting_in(rt.lane(Lane::D2H), w->begin, w->end))
          if (c->bytes > 0) d2h_bytes += c->bytes, d2h_us += c->dur();
        for (const Span* c : starting_in(rt.lane(Lane::H2D), w->begin, w->end))
          if (c->bytes > 0) h2d_bytes += c->bytes, h2d_us += c->dur();
      }
    if (!complete) continue;
    ++out.steps;
    for (int r = 0; r < s.pp; ++r) {
      auto& group = step[static_cast<std::size_t>(r)];
      const RankStep& lead = group[0];
      // Units: per op, position j in the op, max occupancy over the TP group; summed per part.
      std::map<std::pair<int, std::uint32_t>, double> f_sum, b_sum, w_sum;  // (op, part) -> µs
      std::vector<std::vector<std::vector<std::size_t>>> members(static_cast<std::size_t>(tp));
      for (int t = 0; t < tp; ++t) {
        const RankStep& rs = group[static_cast<std::size_t>(t)];
        auto& m = members[static_cast<std::size_t>(t)];
        m.assign(rs.ops.size(), {});
        for (std::size_t i = 0; i < rs.units.size(); ++i)
          if (rs.op_of[i] >= 0) m[static_cast<std::size_t>(rs.op_of[i])].push_back(i);
      }
      for (std::size_t k = 0; k < lead.ops.size(); ++k) {
        std::size_t n = members[0][k].size();
        for (int t = 1; t < tp; ++t) n = std::min(n, members[static_cast<std::size_t>(t)][k].size());
        double op_lag = 0;
        for (std::size_t j = 0; j < n; ++j) {
          double dur = 0, lag = 0;
          for (int t = 0; t < tp; ++t) {
            const RankStep& rs = group[static_cast<std::size_t>(t)];
            std::size_t i = members[static_cast<std::size_t>(t)][k][j];
            dur = std::max(dur, rs.units[i]->dur());
            lag = std::max(lag, rs.lag[i]);
          }
          op_lag += lag;
          const Span* u = lead.units[members[0][k][j]];
          auto key = std::make_pair(static_cast<int>(k), u->part);
          (u->kind == Kind::F ? f_sum : u->kind == Kind::B ? b_sum : w_sum)[key] += dur;
        }
        issue[static_cast<std::size_t>(sched::op_shape(s.ranks[r][k]))].push_back(op_lag);
      }
      for (auto& [k, v] : f_sum) f_cost.push_back(v);
      for (auto& [k, v] : b_sum) b_cost.push_back(v);
      for (auto& [k, v] : w_sum) w_cost.push_back(v);
      out.parts += static_cast<int>(f_sum.size() + b_sum.size() + w_sum.size());
      // All-reduces: the j-th of the step on every TP rank is the same collective.
      if (tp > 1) {
        std::size_t n = lead.ars.size();
        for (int t = 1; t < tp; ++t) n = std::min(n, group[static_cast<std::size_t>(t)].ars.size());
        std::map<std::uint32_t, int> per_part;
        for (std::size_t j = 0; j < n; ++j) {
          double d = lead.ars[j]->dur();
          for (int t = 1; t < tp; ++t) d = std::min(d, group[static_cast<std::size_t>(t)].ars[j]->dur());
          ar_cost.push_back(d);
          ++per_part[lead.ars[j]->part];
        }
        for (auto& [p, c] : per_part) ars_per_part.push_back(c);
      }
    }
    // Messages: receive end − end of the producing op, when the consumer was waiting for it.
    for (int r = 0; r < s.pp; ++r)
      for (int t = 0; t < tp; ++t) {
        const RankStep& rs = step[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        if (rs.recv_by_name.empty()) continue;
        for (std::size_t k = 0; k < rs.ops.size(); ++k) {
          auto msgs = sched::op_messages(s, r, s.ranks[r][k]).recv;
          double landed = -1, produced = 0;
          for (const sched::Message& m : msgs) {
            auto snd = sender.find(message_key(m));
            if (snd == sender.end()) continue;
            const RankStep& ps = step[static_cast<std::size_t>(snd->second.first)][static_cast<std::size_t>(t)];
            auto it = rs.recv_by_name.find("recv " + sched::to_string(m));
            if (it == rs.recv_by_name.end()) continue;
            double land = it->second->end;
            if (land < 0) continue;
            if (land > landed) {
              landed = land;
              produced = ps.ops[static_cast<std::size_t>(snd->second.second)]->end;
            }
          }
          if (landed < 0) continue;
          double free_at = k > 0 ? rs.ops[k - 1]->end : rs.window.begin;
          if (free_at < produced) {
            p2p_cost.push_back(std::max(0.0, landed - produced));
            ++out.messages;
          }
        }
      }
  }
  constexpr double ms = 1e-3;
  out.costs.tf = mean(f_cost) * ms;
  out.costs.tb = mean(b_cost) * ms;
  out.costs.tw = mean(w_cost) * ms;
  out.all_reduces = static_cast<int>(ar_cost.size());
  out.costs.units = ar_cost.empty() ? 2 : std::max(1, median(ars_per_part));
  out.costs.tar = mean(ar_cost) * ms * out.costs.units;
  out.costs.tp2p = mean(p2p_cost) * ms;
  // Issue overhead per op shape; a shape the run never ran gets the sum over its parts of the
  // overhead of plain ops of those passes (F, B or B*, W), so `stp sim` of another schedule has one.
  for (int k = 0; k < sched::kOpShapes; ++k) {
    out.issue_samples[static_cast<std::size_t>(k)] = static_cast<int>(issue[static_cast<std::size_t>(k)].size());
    out.costs.issue[static_cast<std::size_t>(k)] = mean(issue[static_cast<std::size_t>(k)]) * ms;
  }
  auto measured = [&](int k) { return !issue[static_cast<std::size_t>(k)].empty(); };
  auto plain = [&](int k, int alt) {
    return measured(k) ? out.costs.issue[static_cast<std::size_t>(k)] : measured(alt) ? out.costs.issue[static_cast<std::size_t>(alt)] : 0.0;
  };
  const double f = plain(0, 0), b = plain(1, 2), bd = plain(2, 1), w = plain(3, 3);
  const double fallback[sched::kOpShapes] = {f, b, bd, w, f + b, f + bd, f + w, 2 * f};
  for (int k = 0; k < sched::kOpShapes; ++k)
    if (!measured(k)) out.costs.issue[static_cast<std::size_t>(k)] = fallback[k];
  out.d2h_gbps = d2h_us > 0 ? d2h_bytes / (d2h_us * 1e3) : 0;
  out.h2d_gbps = h2d_us > 0 ? h2d_bytes / (h2d_us * 1e3) : 0;
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
