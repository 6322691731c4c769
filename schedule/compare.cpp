// Table 1: closed forms of the paper next to the simulator (see compare.h).
#include "schedule/compare.h"

#include <algorithm>
#include <cstdio>

#include "base/error.h"
#include "schedule/render.h"
#include "schedule/validator.h"

namespace stp::sched {

namespace {

// The paper's closed forms (docs/schedules.md, Table 1 of the paper), costs per chunk.
CompareRow formula(const std::string& name, int p, int m, const Costs& c) {
  CompareRow row;
  row.schedule = name;
  if (name == "1f1b-i") {
    row.pp_formula = (p - 1) * (c.tf + c.tar + c.tb + c.tw);
    row.tp_formula = 2.0 * m * c.tar;
    row.peak_formula = 3 * p - 2;
  } else if (name == "zb-v") {
    row.pp_formula = (p - 1) * (c.tf + 2 * c.tar + c.tb - 2 * c.tw);
    row.tp_formula = 4.0 * m * c.tar;
    row.peak_formula = 2 * p;
  } else {
    row.pp_formula = (p - 1) * (c.tf + c.tar + c.tb - c.tw);
    row.tp_formula = (2 * p + 1) * c.tar;
    row.peak_formula = 3 * p;
  }
  return row;
}

}  // namespace

std::vector<CompareRow> compare_table1(int pp, int m, const Costs& c) {
  std::vector<CompareRow> rows;
  for (const char* name : {"1f1b-i", "zb-v", "stp"}) {
    Schedule s = generate(name, pp, m);
    validate(s);
    SimResult r = simulate(s, c);
    CompareRow row = formula(name, pp, m, c);
    for (const RankStats& rs : r.ranks) {
      row.pp_sim = std::max(row.pp_sim, rs.pp_bubble);
      row.tp_sim = std::max(row.tp_sim, rs.tp_exposed);
      row.peak_sim = std::max(row.peak_sim, rs.peak_activation);
      row.peak_transient = std::max(row.peak_transient, rs.peak_transient);
    }
    row.makespan = r.makespan;
    rows.push_back(row);
  }
  return rows;
}

std::string render_compare(int pp, int m, const Costs& c) {
  std::vector<CompareRow> rows = compare_table1(pp, m, c);
  std::string out = str("Table 1, p = ", pp, ", m = ", m, ", T_F ", format_number(c.tf), ", T_B ", format_number(c.tb),
                        ", T_W ", format_number(c.tw), ", T_AR ", format_number(c.tar), ", T_P2P ",
                        format_number(c.tp2p), " (per chunk); formula | simulated\n\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-8s %21s %21s %16s %10s %9s\n", "schedule", "PP bubble", "TP bubble",
                "peak act (M_a)", "transient", "makespan");
  out += line;
  for (const CompareRow& r : rows) {
    std::snprintf(line, sizeof line, "%-8s %10s | %-8s %10s | %-8s %7d | %-6d %10d %9s\n", r.schedule.c_str(),
                  format_number(r.pp_formula).c_str(), format_number(r.pp_sim).c_str(),
                  format_number(r.tp_formula).c_str(), format_number(r.tp_sim).c_str(), r.peak_formula, r.peak_sim,
                  r.peak_transient, format_number(r.makespan).c_str());
    out += line;
  }
  out +=
      "\nSimulated PP / TP bubble: the largest per-rank idle time waiting for pipeline inputs / for the rank's own\n"
      "TP all-reduces; peak act: most live chunk-microbatch activation sets between ops (a braided block is one\n"
      "op); transient: the same count inside an op (a block's forward allocates before its backward frees).\n"
      "Where they differ from the formulas (details in docs/schedules.md):\n"
      " * 1F1B-I peak: the table writes 3p-2, the warm-up forward count of rank 0; the first steady forward runs\n"
      "   before the first backward frees anything, so between ops rank 0 holds warm-up + 1 = 3p-1 sets.\n"
      " * STP TP: (2p+1)T_AR are the plain forwards of rank 0's fill; the simulator also counts, per rank, the\n"
      "   last all-reduce of each F&B* block and F+F block (T_AR/units each) that has nothing left to hide under.\n"
      " * PP formulas put the fill chain's all-reduces (T_AR per hop) into the PP bubble; the simulator books\n"
      "   a rank's own all-reduce waits as TP and only waits for other ranks as PP, so the two columns split\n"
      "   the same idle time differently when T_AR > 0.\n"
      " * STP below m = 3p-1 uses the truncated fallback (docs/schedules.md); its bubble exceeds the formula.\n";
  return out;
}

}  // namespace stp::sched
