// Table 1 of the STP paper against the simulator (docs/schedules.md, Table 1 of the paper; compare.h), and STP's
// small-m fallback.
#include <gtest/gtest.h>

#include <algorithm>

#include "schedule/compare.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"

using namespace stp::sched;

namespace {

SimResult sim(const char* name, int p, int m, const Costs& c) {
  Schedule s = generate(name, p, m);
  validate(s);
  return simulate(s, c);
}

double max_pp(const SimResult& r) {
  double v = 0;
  for (const RankStats& rs : r.ranks) v = std::max(v, rs.pp_bubble);
  return v;
}

Costs costs(double t, double tar) {
  Costs c;
  c.tf = c.tb = c.tw = t;
  c.tar = tar;
  return c;
}

}  // namespace

// T_F = T_B = T_W, T_AR = 0: STP's PP bubble is (p−1)(T_F+T_B−T_W) for every m ≥ 3p−1.
TEST(Table1, StpPpBubbleEqualsFormula) {
  for (int p : {2, 3, 4, 8})
    for (int m : {3 * p - 1, 3 * p, 4 * p, 6 * p + 1})
      for (double t : {1.0, 2.5}) {
        SimResult r = sim("stp", p, m, costs(t, 0));
        EXPECT_DOUBLE_EQ(max_pp(r), (p - 1) * t) << "p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(r.makespan - 2 * m * 3 * t, (p - 1) * t) << "p=" << p << " m=" << m;
      }
}

// Peak activation between ops: 3p for STP, 2p for ZB-V, warm-up + 1 = 3p−1 for 1F1B-I on rank 0. Table 1
// writes 3p−2 for 1F1B-I: that is Megatron's warm-up count 2(p−1)+p on rank 0; the first steady forward
// allocates before the first backward frees, so the count between ops is one more. Inside STP's F&B blocks
// the forward allocates before the backward frees too: transient 3p+1, reported separately.
TEST(Table1, PeakActivation) {
  for (int p : {2, 3, 4, 8}) {
    int m = 4 * p;
    SimResult stp = sim("stp", p, m, costs(1, 0)), zbv = sim("zb-v", p, m, costs(1, 0));
    SimResult i1f1b = sim("1f1b-i", p, m, costs(1, 0));
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(stp.ranks[r].peak_activation, 3 * p) << "p=" << p << " rank " << r;
      EXPECT_EQ(stp.ranks[r].peak_transient, 3 * p + 1) << "p=" << p << " rank " << r;
      EXPECT_EQ(zbv.ranks[r].peak_activation, 2 * p) << "p=" << p << " rank " << r;
    }
    EXPECT_EQ(i1f1b.ranks[0].peak_activation, 3 * p - 1) << "p=" << p;
  }
}

// With T_AR > 0: 1F1B-I exposes T_AR on each of its 2m forwards and ZB-V on each of its 2m forwards and 2m
// split backwards — the simulator reproduces 2m·T_AR and 4m·T_AR exactly, and their PP bubbles equal the
// formulas. STP's exposure does not grow with m: on rank 0 it is the (2p+1) plain forwards of the fill —
// the formula's (2p+1)·T_AR — plus the last all-reduce of each of the 3p−3 F&B* blocks (S4 and S6), which
// has nothing left to hide under: T_AR/units each. That second term is where simulation and formula differ;
// with L layers per chunk it shrinks to T_AR/(2L) per block (docs/schedules.md, STP op lists).
TEST(Table1, TpBubble) {
  const double tar = 0.5;
  for (int p : {2, 4, 8}) {
    double stp_tp = -1;
    for (int m : {4 * p, 8 * p, 16 * p}) {
      Costs c = costs(1, tar);
      SimResult i1f1b = sim("1f1b-i", p, m, c), zbv = sim("zb-v", p, m, c), stp = sim("stp", p, m, c);
      for (int r = 0; r < p; ++r) {
        EXPECT_DOUBLE_EQ(i1f1b.ranks[r].tp_exposed, 2 * m * tar);
        EXPECT_DOUBLE_EQ(zbv.ranks[r].tp_exposed, 4 * m * tar);
      }
      EXPECT_DOUBLE_EQ(i1f1b.ranks[0].pp_bubble, (p - 1) * (1 + tar + 1 + 1));
      EXPECT_DOUBLE_EQ(max_pp(zbv), (p - 1) * (1 + 2 * tar + 1 - 2));
      EXPECT_DOUBLE_EQ(stp.ranks[0].tp_exposed, (2 * p + 1) * tar + (3 * p - 3) * tar / c.units) << "p=" << p;
      if (stp_tp >= 0) {
        EXPECT_DOUBLE_EQ(stp.ranks[0].tp_exposed, stp_tp) << "STP's TP bubble grows with m";
      }
      stp_tp = stp.ranks[0].tp_exposed;
    }
  }
}

// STP's PP bubble with T_AR > 0 is above the formula (p−1)(T_F+T_AR+T_B−T_W) by the F&B* tails that lie on
// the fill path; we pin the measured value so a change in the model is noticed.
TEST(Table1, StpPpBubbleWithAllReduce) {
  SimResult r = sim("stp", 4, 16, costs(1, 0.5));
  EXPECT_DOUBLE_EQ(max_pp(r), 5.25);  // formula: 3 · 1.5 = 4.5
}

// With T_AR > 0 and m ≥ 4p STP finishes first.
TEST(Table1, StpMakespanBeatsInterleavedAndZbv) {
  for (int p : {2, 4, 8})
    for (int m : {4 * p, 8 * p})
      for (double tar : {0.1, 0.5, 1.0}) {
        Costs c = costs(1, tar);
        double stp = sim("stp", p, m, c).makespan;
        EXPECT_LT(stp, sim("1f1b-i", p, m, c).makespan) << "p=" << p << " m=" << m << " tar=" << tar;
        EXPECT_LT(stp, sim("zb-v", p, m, c).makespan) << "p=" << p << " m=" << m << " tar=" << tar;
      }
}

// The fallback for 2p ≤ m < 3p−1 (docs/schedules.md, STP for 2p ≤ m < 3p−1): unit costs, no communication, bubble =
// makespan − 6m.
TEST(Table1, StpFallbackBubble) {
  struct Case {
    int p, m;
    double bubble;
  };
  for (Case k : {Case{2, 4, 4}, Case{3, 6, 7}, Case{3, 7, 5}, Case{4, 8, 10}, Case{4, 9, 9}, Case{4, 10, 6},
                 Case{8, 16, 22}, Case{8, 20, 16}, Case{8, 22, 10}}) {
    SimResult r = sim("stp", k.p, k.m, costs(1, 0));
    EXPECT_DOUBLE_EQ(r.makespan - 6 * k.m, k.bubble) << "p=" << k.p << " m=" << k.m;
    for (const RankStats& rs : r.ranks) EXPECT_LE(rs.peak_activation, 3 * k.p);
  }
}

TEST(Table1, CompareRowsCarryFormulaAndSimulation) {
  std::vector<CompareRow> rows = compare_table1(4, 16, costs(1, 0));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].schedule, "1f1b-i");
  EXPECT_EQ(rows[0].peak_formula, 10);
  EXPECT_EQ(rows[0].peak_sim, 11);
  EXPECT_DOUBLE_EQ(rows[2].pp_formula, rows[2].pp_sim);
  EXPECT_NE(render_compare(4, 16, costs(1, 0)).find("warm-up + 1 = 3p-1"), std::string::npos);
}

// Unequal costs: with T_B = 2T_F (= 2T_W) STP's bubble is 3(p−1), not the formula's 2(p−1) (docs/schedules.md, STP op
// lists, Pitfalls): the formula assumes balanced times.
TEST(Table1, StpBubbleWithSlowBackwardExceedsFormula) {
  for (int p : {2, 4, 8}) {
    Costs c = costs(1, 0);
    c.tb = 2;
    SimResult r = sim("stp", p, 4 * p, c);
    EXPECT_DOUBLE_EQ(r.makespan - 2 * 4 * p * 4, 3 * (p - 1)) << "p=" << p;
    EXPECT_DOUBLE_EQ((p - 1) * (c.tf + c.tb - c.tw), 2 * (p - 1));
  }
}
