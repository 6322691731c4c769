// Simulator golden values (docs/schedules.md, Golden values: unit costs, no communication, p=4, m=8) and
// the cost model of simulator.h on single ops.
#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"

using namespace stp::sched;

namespace {

SimResult sim(const char* name, int p, int m, Costs c = Costs{}) {
  Schedule s = generate(name, p, m);
  validate(s);
  return simulate(s, c);
}

double longest_span(const SimResult& r) {
  double best = 0;
  for (const RankStats& rs : r.ranks) best = std::max(best, rs.span);
  return best;
}

}  // namespace

TEST(SimGolden, GPipe) {
  SimResult r = sim("gpipe", 4, 8);
  EXPECT_DOUBLE_EQ(longest_span(r), 33);
  for (const RankStats& rs : r.ranks) EXPECT_EQ(rs.peak_activation, 8);
}

TEST(SimGolden, OneFOneB) {
  SimResult r = sim("1f1b", 4, 8);
  EXPECT_DOUBLE_EQ(longest_span(r), 33);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(r.ranks[k].peak_activation, 4 - k);
}

TEST(SimGolden, Interleaved1F1B) {
  SimResult r = sim("1f1b-i", 4, 8);
  const double ends[] = {57, 55, 53, 51};
  const int peaks[] = {11, 9, 7, 5};
  for (int k = 0; k < 4; ++k) {
    EXPECT_DOUBLE_EQ(r.ranks[k].start, k);
    EXPECT_DOUBLE_EQ(r.ranks[k].end, ends[k]);
    EXPECT_DOUBLE_EQ(r.ranks[k].busy, 48);
    EXPECT_EQ(r.ranks[k].peak_activation, peaks[k]);
  }
  EXPECT_DOUBLE_EQ(r.ranks[0].pp_bubble, 9);  // (p−1)(T_F+T_B+T_W)
}

TEST(SimGolden, ZbH1) { EXPECT_DOUBLE_EQ(longest_span(sim("zb-h1", 4, 8)), 27); }

TEST(SimGolden, ZbV) {
  SimResult r = sim("zb-v", 4, 8);
  for (int k = 0; k < 4; ++k) {
    EXPECT_DOUBLE_EQ(r.ranks[k].start, k);
    EXPECT_DOUBLE_EQ(r.ranks[k].span, 48);
    EXPECT_DOUBLE_EQ(r.ranks[k].pp_bubble, 0);
    EXPECT_EQ(r.ranks[k].peak_activation, 8);
    EXPECT_EQ(r.ranks[k].peak_residue, 8);  // counted F-to-W: also 8
  }
}

TEST(SimGolden, StpBubbleAndMemoryAtP4M12) {
  SimResult r = sim("stp", 4, 12);
  EXPECT_DOUBLE_EQ(r.makespan - 2 * 12 * 3, 3);  // makespan − 2m(T_F+T_B+T_W) = p−1
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(r.ranks[k].peak_activation, 12) << "rank " << k;  // 3p
    EXPECT_EQ(r.ranks[k].peak_transient, 13) << "rank " << k;   // 3p+1 inside an F&B block
  }
  // F-to-W lifetimes peak at 3p + max(r, 1) (docs/schedules.md, STP op lists, Pitfalls).
  EXPECT_EQ(r.ranks[0].peak_residue, 13);
  EXPECT_EQ(r.ranks[1].peak_residue, 13);
  EXPECT_EQ(r.ranks[2].peak_residue, 14);
  EXPECT_EQ(r.ranks[3].peak_residue, 15);
}

TEST(CostModel, SingleOpDurations) {
  Costs c;
  c.tf = 2, c.tb = 3, c.tw = 1.5, c.tar = 1, c.units = 2;
  auto duration = [&](const char* text) {
    auto seg = op_segments(parse_op(text), c, 10.0);
    double end = 10.0;
    for (const Segment& s : seg) end = std::max(end, s.end);
    return end - 10.0;
  };
  EXPECT_DOUBLE_EQ(duration("F0.1"), 3);    // tf + tar, every AR exposed
  EXPECT_DOUBLE_EQ(duration("B0.1*"), 4);   // tb + tar
  EXPECT_DOUBLE_EQ(duration("B0.1"), 4.5);  // tb + tw, AR (0.5 per unit) hidden under W (0.75 per unit)
  EXPECT_DOUBLE_EQ(duration("W0.1"), 1.5);
  EXPECT_DOUBLE_EQ(duration("F0.2&B0.1"), 6.5);   // tf + tb + tw: every AR hidden
  EXPECT_DOUBLE_EQ(duration("F0.2&B0.1*"), 5.5);  // tf + tb + the last B all-reduce (tar/units)
  EXPECT_DOUBLE_EQ(duration("F0.2&W1.1"), 3.5);   // tf + tw: F's ARs hidden under W pieces
  EXPECT_DOUBLE_EQ(duration("F0.1+F0.2"), 4.5);   // 2tf + the last all-reduce of the second forward
  c.tw = 0.2;                                     // W too short to hide the AR: the excess shows
  EXPECT_DOUBLE_EQ(duration("B0.1"), 3 + 0.2 + 2 * (0.5 - 0.1));
}

TEST(CostModel, RejectsNegativeCosts) {
  Costs c;
  c.tb = -1;
  Schedule s = generate("1f1b", 2, 2);
  EXPECT_THROW(simulate(s, c), stp::Error);
}
