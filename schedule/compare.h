// Table 1 of the STP paper (docs/schedules.md, Table 1 of the paper) next to the simulator, for 1F1B-I, ZB-V and STP:
// PP bubble, TP bubble and peak activation memory, formula and simulated value side by side.
//
// Simulated columns: PP and TP are the largest per-rank pp_bubble and tp_exposed (simulator.h); peak is
// the largest per-rank peak_activation (M_a units, between ops), with the transient inside ops beside it.
// docs/schedules.md explains each place where simulation and formula differ.
#pragma once

#include <string>
#include <vector>

#include "schedule/simulator.h"

namespace stp::sched {

struct CompareRow {
  std::string schedule;
  double pp_formula = 0, pp_sim = 0;
  double tp_formula = 0, tp_sim = 0;
  int peak_formula = 0, peak_sim = 0, peak_transient = 0;
  double makespan = 0;
};

// Throws stp::Error if m is below a schedule's minimum (STP: 2p) or a cost is negative.
std::vector<CompareRow> compare_table1(int pp, int microbatches, const Costs& c);
std::string render_compare(int pp, int microbatches, const Costs& c);

}  // namespace stp::sched
