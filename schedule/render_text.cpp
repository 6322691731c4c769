// Text and JSON renderers.
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "base/json_number.h"
#include "schedule/render.h"

namespace stp::sched {

std::string format_number(double v) {
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9) std::snprintf(buf, sizeof buf, "%.0f", std::round(v));
  else std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

nlohmann::ordered_json number_json(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9) v = std::round(v);
  return json_number(v, 6);
}

namespace {

// One Gantt cell: the op's letter (upper case = chunk 0, lower case = chunk 1); braided blocks '#' (F&B),
// '%' (F&W), '=' (F+F); '.' idle.
char cell(const Op& op) {
  switch (op.kind) {
    case OpKind::FB: return '#';
    case OpKind::FW: return '%';
    case OpKind::FF: return '=';
    default: break;
  }
  static const char kUpper[] = {'F', 'B', 'W'}, kLower[] = {'f', 'b', 'w'};
  int p = static_cast<int>(op.a.pass);
  return op.a.chunk == 0 ? kUpper[p] : kLower[p];
}

std::string gantt_row(const Schedule& s, const SimResult& r, int rank, int width) {
  std::string row(width, '.');
  double scale = r.makespan > 0 ? width / r.makespan : 0;
  const auto& ops = s.ranks[rank];
  for (std::size_t i = 0; i < ops.size(); ++i) {
    int a = static_cast<int>(std::lround(r.times[rank][i].start * scale));
    int b = static_cast<int>(std::lround(r.times[rank][i].end * scale));
    for (int x = a; x < std::max(b, a + 1) && x < width; ++x) row[x] = cell(ops[i]);
  }
  return row;
}

}  // namespace

std::string render_text(const Schedule& s, const SimResult& r, int width) {
  std::string out = str("schedule ", s.name, "  pp ", s.pp, "  microbatches ", s.microbatches, "  chunks ", s.chunks,
                        "  makespan ", format_number(r.makespan), "\n\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %10s %10s %10s %10s %8s %9s %8s\n", "rank", "span", "busy", "pp_bubble",
                "tp_exposed", "peak_act", "transient", "residue");
  out += line;
  for (const RankStats& rs : r.ranks) {
    std::snprintf(line, sizeof line, "%-5d %10s %10s %10s %10s %8d %9d %8d\n", rs.rank, format_number(rs.span).c_str(),
                  format_number(rs.busy).c_str(), format_number(rs.pp_bubble).c_str(),
                  format_number(rs.tp_exposed).c_str(), rs.peak_activation, rs.peak_transient, rs.peak_residue);
    out += line;
  }
  out += str("\ntimeline (", width, " columns = ", format_number(r.makespan),
             " time units; F B W chunk 0, f b w chunk 1, # F&B, % F&W, = F+F, . idle)\n");
  for (int k = 0; k < s.pp; ++k) out += str("rank ", k, (k < 10 ? "  |" : " |"), gantt_row(s, r, k, width), "|\n");
  out += "\nops\n";
  for (int k = 0; k < s.pp; ++k) out += str("rank ", k, ": ", join_ops(s.ranks[k]), "\n");
  return out;
}

std::string render_json(const Schedule& s, const SimResult& r) {
  nlohmann::ordered_json out;
  out["schedule"] = s.name;
  out["pp"] = s.pp;
  out["microbatches"] = s.microbatches;
  out["makespan"] = number_json(r.makespan);
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankStats& rs : r.ranks)
    ranks.push_back({{"rank", rs.rank},
                     {"span", number_json(rs.span)},
                     {"busy", number_json(rs.busy)},
                     {"pp_bubble", number_json(rs.pp_bubble)},
                     {"tp_exposed", number_json(rs.tp_exposed)},
                     {"peak_activation", rs.peak_activation}});
  out["ranks"] = std::move(ranks);
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (int k = 0; k < s.pp; ++k) {
    nlohmann::ordered_json rank_ops = nlohmann::ordered_json::array();
    for (const Op& op : s.ranks[k]) rank_ops.push_back(to_string(op));
    ops.push_back(std::move(rank_ops));
  }
  out["ops"] = std::move(ops);
  return out.dump() + "\n";
}

}  // namespace stp::sched
