// Discrete-event simulation of a schedule (cost model in simulator.h).
#include "schedule/simulator.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "schedule/dataflow.h"

namespace stp::sched {

int op_shape(const Op& op) {
  switch (op.kind) {
    case OpKind::F: return 0;
    case OpKind::B: return op.a.defer_w ? 2 : 1;
    case OpKind::W: return 3;
    case OpKind::FB: return op.b.defer_w ? 5 : 4;
    case OpKind::FW: return 6;
    case OpKind::FF: return 7;
  }
  return 0;
}

const char* op_shape_name(int shape) {
  static const char* const kNames[kOpShapes] = {"F", "B", "B*", "W", "F&B", "F&B*", "F&W", "F+F"};
  STP_ASSERT(shape >= 0 && shape < kOpShapes, "op shape ", shape);
  return kNames[shape];
}

void check_costs(const Costs& c) {
  const std::pair<const char*, double> named[] = {
      {"tf", c.tf}, {"tb", c.tb}, {"tw", c.tw}, {"tar", c.tar}, {"tp2p", c.tp2p}};
  for (const auto& [name, v] : named)
    STP_CHECK(std::isfinite(v) && v >= 0, "cost --", name, " must be a finite number >= 0, got ", v);
  for (int k = 0; k < kOpShapes; ++k)
    STP_CHECK(std::isfinite(c.issue[k]) && c.issue[k] >= 0, "issue overhead of ", op_shape_name(k),
              " ops must be a finite number >= 0, got ", c.issue[k]);
  STP_CHECK(c.units >= 1, "units per pass must be at least 1, got ", c.units);
}

namespace {

struct Unit {
  int part;
  Pass pass;
  double dur;
  double ar;  // all-reduce launched when the unit ends (0: none)
};

// The compute units of an op in stream order (simulator.h table).
void build_units(const Op& op, const Costs& c, std::vector<Unit>& u) {
  const int k = c.units;
  const double f = c.tf / k, b = c.tb / k, w = c.tw / k, ar = c.tar / k;
  u.clear();
  for (int i = 0; i < k; ++i) {
    switch (op.kind) {
      case OpKind::F: u.push_back({0, Pass::F, f, ar}); break;
      case OpKind::B:
        u.push_back({0, Pass::B, b, ar});
        if (!op.a.defer_w) u.push_back({0, Pass::W, w, 0});
        break;
      case OpKind::W: u.push_back({0, Pass::W, w, 0}); break;
      case OpKind::FB:
        u.push_back({0, Pass::F, f, ar});
        u.push_back({1, Pass::B, b, ar});
        if (!op.b.defer_w) u.push_back({1, Pass::W, w, 0});
        break;
      case OpKind::FW:
        u.push_back({0, Pass::F, f, ar});
        u.push_back({1, Pass::W, w, 0});
        break;
      case OpKind::FF:
        u.push_back({0, Pass::F, f, ar});
        u.push_back({1, Pass::F, f, ar});
        break;
    }
  }
}

// Lays the units out from `start`; calls emit(segment) for each non-empty segment; returns the op's end.
template <typename Emit>
double lay_out(const std::vector<Unit>& units, double start, Emit&& emit) {
  double compute = start, comm = start;
  double ar_done[2] = {start, start};  // last all-reduce of each part
  for (const Unit& u : units) {
    double s = u.pass == Pass::W ? compute : std::max(compute, ar_done[u.part]);
    compute = s + u.dur;
    if (u.dur > 0) emit(Segment{0, u.part, u.pass, s, compute});
    if (u.pass == Pass::W) continue;
    double as = std::max(comm, compute);
    comm = as + u.ar;
    ar_done[u.part] = comm;
    if (u.ar > 0) emit(Segment{1, u.part, u.pass, as, comm});
  }
  return std::max(compute, comm);
}

struct Shape {
  double duration = -1, work = 0;
};

// Duration and compute work depend only on the op's kind and deferral: cache the 12 shapes.
struct ShapeCache {
  explicit ShapeCache(const Costs& costs) : c(costs) {}
  const Costs& c;
  Shape shapes[6][2];
  std::vector<Unit> units;
  const Shape& get(const Op& op) {
    bool defer = (op.kind == OpKind::B && op.a.defer_w) || (op.kind == OpKind::FB && op.b.defer_w);
    Shape& sh = shapes[static_cast<int>(op.kind)][defer];
    if (sh.duration < 0) {
      build_units(op, c, units);
      const double issue = c.issue[op_shape(op)];
      sh.work = issue;
      for (const Unit& u : units) sh.work += u.dur;
      sh.duration = lay_out(units, issue, [](const Segment&) {});
    }
    return sh;
  }
};

struct RankState {
  double free = 0;
  int live = 0, residue = 0;
};

}  // namespace

std::vector<Segment> op_segments(const Op& op, const Costs& c, double start) {
  std::vector<Unit> units;
  build_units(op, c, units);
  std::vector<Segment> out;
  lay_out(units, start + c.issue[op_shape(op)], [&](const Segment& s) { out.push_back(s); });
  return out;
}

SimResult simulate(const Schedule& s, const Costs& c) {
  check_costs(c);
  const DataKey key{s.n_stages(), s.microbatches};
  std::vector<int> stage_rank(s.n_stages());
  for (int st = 0; st < s.n_stages(); ++st) stage_rank[st] = rank_of_stage(s, st);
  std::vector<double> ready(key.size(), 0.0);  // when each output was produced
  ShapeCache shapes(c);
  std::vector<RankState> state(s.pp);
  SimResult res;
  res.ranks.resize(s.pp);
  res.times.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    res.ranks[r].rank = r;
    res.times[r].resize(s.ranks[r].size());
  }

  walk_dataflow(s, [&](int r, int i) {
    const Op& op = s.ranks[r][i];
    RankState& st = state[r];
    RankStats& rs = res.ranks[r];
    // 1. start: rank free and every input arrived.
    double start = st.free;
    for (int k = 0; k < op.n_parts(); ++k) {
      int in = input_key(s, key, r, op.part(k));
      if (in < 0) continue;
      int in_stage = (in / s.microbatches) % s.n_stages();
      start = std::max(start, ready[in] + (stage_rank[in_stage] != r ? c.tp2p : 0.0));
    }
    // 2. duration from the op's shape; outputs are ready at its end.
    const Shape& sh = shapes.get(op);
    double end = start + sh.duration;
    res.times[r][i] = {start, end};
    st.free = end;
    if (i == 0) rs.start = start;
    rs.end = end;
    rs.busy += sh.work;
    rs.tp_exposed += sh.duration - sh.work;
    for (int k = 0; k < op.n_parts(); ++k) ready[output_key(s, key, r, op.part(k))] = end;
    // 3. activation sets: forwards allocate, backwards free, W's free the residue.
    int n_f = 0, n_b = 0, n_w = 0;
    for (int k = 0; k < op.n_parts(); ++k) {
      const Part& p = op.part(k);
      n_f += p.pass == Pass::F;
      n_b += p.pass == Pass::B;
      n_w += p.pass == Pass::W || (p.pass == Pass::B && !p.defer_w);
    }
    rs.peak_transient = std::max(rs.peak_transient, st.live + n_f);
    st.live += n_f - n_b;
    st.residue += n_f;
    rs.peak_residue = std::max(rs.peak_residue, st.residue);
    st.residue -= n_w;
    rs.peak_activation = std::max(rs.peak_activation, st.live);
  });

  for (RankStats& rs : res.ranks) {
    rs.span = rs.end - rs.start;
    rs.pp_bubble = rs.span - rs.busy - rs.tp_exposed;
    res.makespan = std::max(res.makespan, rs.end);
  }
  return res;
}

}  // namespace stp::sched
