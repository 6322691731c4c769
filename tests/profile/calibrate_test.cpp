// Calibration (profile/calibrate.h) and prediction (profile/predict.h):
//  * round trip: a trace drawn from the simulator's own timeline with known costs calibrates back
//    to those costs, and the prediction then equals the measurement;
//  * a hand-made trace checks the TP-group rules (slowest member's unit, fastest all-reduce) and
//    the issue-gap charging (leading part to the previous unit, the rest to the next).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "profile/calibrate.h"
#include "profile/predict.h"
#include "profile/trace_reader.h"
#include "schedule/schedule.h"
#include "schedule/simulator.h"
#include "tests/profile/trace_builder.h"

namespace {

namespace sched = stp::sched;
using stp::str;
using stp::testing::TraceBuilder;

constexpr double kUs = 1000;  // simulator time unit = 1 ms

// The trace an ideal run of `s` would leave: the simulator's ops, units and all-reduces (as the
// executor names them), a receive span per cross-rank input from when the consumer became free
// until the data landed (producer's op end + tp2p), on every TP rank, inside one "step 1" span.
std::string simulated_trace(const sched::Schedule& s, const sched::Costs& c, int tp) {
  sched::SimResult r = sched::simulate(s, c);
  TraceBuilder b;
  static const char* kCat[] = {"F", "B", "W"};
  for (int rank = 0; rank < s.pp; ++rank)
    for (int t = 0; t < tp; ++t) {
      int pid = rank * tp + t;
      b.x(pid, "compute", "step 1", "step", -1 * kUs, (r.makespan + 2) * kUs);
      double free_at = 0;
      for (std::size_t i = 0; i < s.ranks[rank].size(); ++i) {
        const sched::Op& op = s.ranks[rank][i];
        const sched::OpTime& ot = r.times[rank][i];
        b.x(pid, "compute", sched::to_string(op), "op", ot.start * kUs, (ot.end - ot.start) * kUs);
        for (const sched::Message& m : sched::op_messages(s, rank, op).recv) {
          // the producing op's end on the sender
          double produced = 0;
          for (std::size_t k = 0; k < s.ranks[m.src].size(); ++k)
            for (const sched::Message& sent : sched::op_messages(s, m.src, s.ranks[m.src][k]).send)
              if (sent == m) produced = r.times[m.src][k].end;
          double landed = produced + c.tp2p;
          double from = std::min(free_at, landed);
          b.x(pid, "p2p", "recv " + sched::to_string(m), "p2p", from * kUs, (landed - from) * kUs);
        }
        for (const sched::Segment& seg : sched::op_segments(op, c, ot.start)) {
          std::string part = sched::to_string(op.part(seg.part));
          std::string args = str("{\"part\":\"", part, "\"}");
          if (seg.stream == 0) {
            b.x(pid, "compute", part + " u", kCat[static_cast<int>(seg.pass)], seg.start * kUs,
                (seg.end - seg.start) * kUs, args);
          } else {
            b.x(pid, "tp-comm", "AR " + part, "tp-comm", seg.start * kUs, (seg.end - seg.start) * kUs, args);
          }
        }
        free_at = ot.end;
      }
    }
  return b.json();
}

void round_trip(const char* name, int pp, int m, int tp, sched::Costs c) {
  SCOPED_TRACE(name);
  sched::Schedule s = sched::generate(name, pp, m);
  auto trace = stp::profile::parse_trace(simulated_trace(s, c, tp), "simulated");
  auto ranks = stp::profile::timelines(trace);
  stp::profile::Prediction p = stp::profile::predict(trace, ranks, s, tp);
  const sched::Costs& got = p.calibration.costs;
  const double eps = 1e-6;
  EXPECT_NEAR(got.tf, c.tf, eps);
  EXPECT_NEAR(got.tb, c.tb, eps);
  EXPECT_NEAR(got.tw, c.tw, eps);
  EXPECT_NEAR(got.tar, tp > 1 ? c.tar : 0, eps);
  EXPECT_EQ(got.units, c.units);
  EXPECT_NEAR(got.tp2p, c.tp2p, eps);
  for (int k = 0; k < sched::kOpShapes; ++k) {
    if (p.calibration.issue_samples[static_cast<std::size_t>(k)] == 0) continue;
    EXPECT_NEAR(got.issue[static_cast<std::size_t>(k)], c.issue[static_cast<std::size_t>(k)], eps)
        << sched::op_shape_name(k);
  }
  EXPECT_GT(p.calibration.messages, 0);
  EXPECT_NEAR(p.makespan.measured, p.makespan.predicted, 1e-6);
  for (const auto& rp : p.ranks) {
    EXPECT_NEAR(rp.span.measured, rp.span.predicted, 1e-6) << "rank " << rp.rank;
    EXPECT_NEAR(rp.busy.measured, rp.busy.predicted, 1e-6) << "rank " << rp.rank;
    EXPECT_NEAR(rp.tp_exposed.measured, rp.tp_exposed.predicted, 1e-6) << "rank " << rp.rank;
    EXPECT_NEAR(rp.bubble.measured, rp.bubble.predicted, 1e-6) << "rank " << rp.rank;
  }
}

TEST(Calibrate, SimulatedTracesCalibrateBackToTheirCosts) {
  sched::Costs c;
  c.tf = 3, c.tb = 5, c.tw = 2, c.tar = 4, c.tp2p = 0.5, c.units = 2;
  round_trip("stp", 2, 4, 2, c);
  c.issue = {0.25, 0.5, 0.75, 0.125, 1.5, 1.25, 1, 0.375};  // F, B, B*, W, F&B, F&B*, F&W, F+F
  round_trip("stp", 2, 4, 2, c);
  round_trip("zb-v", 2, 4, 2, c);
  round_trip("1f1b-i", 2, 4, 2, c);
  c.tar = 0;
  c.tp2p = 1.25;
  round_trip("1f1b", 4, 8, 1, c);
}

TEST(Calibrate, SlowestTpMemberIssueGapsAndFastestAllReduce) {
  // gpipe, pp 1, m 1: ops F0.1 then B0.1. tp 2: ranks 0 and 1 (all in µs).
  //   rank 0: F units [0,10) and [25,35); AR [12,20) between them, so the gap [10,25) has 15 - 8 =
  //           7 idle with nothing in flight (an issue gap of F0.1); F's tail AR [35,45);
  //           B unit [45,55) with a fused W [55,60): no gaps.
  //   rank 1: F units [0,14) and [25,30); ARs [14,20) and [35,44); B [44,50), W [50,60):
  //           gaps [14,25) -> 11 - 6 = 5 (F0.1), [30,44) -> 14 - 9 = 5 (before B: B0.1's).
  TraceBuilder b;
  auto unit = [&](int pid, const char* cat, const char* part, double a, double e) {
    b.x(pid, "compute", str(part, " u"), cat, a, e - a, str("{\"part\":\"", part, "\"}"));
  };
  auto ar = [&](int pid, const char* part, double a, double e) {
    b.x(pid, "tp-comm", str("AR ", part), "tp-comm", a, e - a, str("{\"part\":\"", part, "\"}"));
  };
  for (int pid : {0, 1}) b.x(pid, "compute", "step 1", "step", -1, 70);
  b.x(0, "compute", "F0.1", "op", 0, 45).x(0, "compute", "B0.1", "op", 45, 15);
  b.x(1, "compute", "F0.1", "op", 0, 44).x(1, "compute", "B0.1", "op", 44, 16);
  unit(0, "F", "F0.1", 0, 10), unit(0, "F", "F0.1", 25, 35), ar(0, "F0.1", 12, 20), ar(0, "F0.1", 35, 45);
  unit(0, "B", "B0.1", 45, 55), unit(0, "W", "B0.1", 55, 60);
  unit(1, "F", "F0.1", 0, 14), unit(1, "F", "F0.1", 25, 30), ar(1, "F0.1", 14, 20), ar(1, "F0.1", 35, 44);
  unit(1, "B", "B0.1", 44, 50), unit(1, "W", "B0.1", 50, 60);
  auto trace = stp::profile::parse_trace(b.json(), "hand");
  auto ranks = stp::profile::timelines(trace);
  auto cal = stp::profile::calibrate(trace, ranks, sched::generate("gpipe", 1, 1), 2);
  // Units: the slower member's span: F = max(10,14) + max(10,5) = 24 µs; B = max(10,6); W = max(5,10).
  EXPECT_NEAR(cal.costs.tf, 24e-3, 1e-12);
  EXPECT_NEAR(cal.costs.tb, 10e-3, 1e-12);
  EXPECT_NEAR(cal.costs.tw, 10e-3, 1e-12);
  // Issue gaps per op, the larger member's per unit: F0.1 = max(0,0) + max(7,5) = 7; B0.1 = max(0,5) + 0 = 5.
  EXPECT_NEAR(cal.costs.issue[sched::op_shape(sched::parse_op("F0.1"))], 7e-3, 1e-12);
  EXPECT_NEAR(cal.costs.issue[sched::op_shape(sched::parse_op("B0.1"))], 5e-3, 1e-12);
  EXPECT_EQ(cal.issue_samples[0], 1);
  EXPECT_EQ(cal.issue_samples[1], 1);
  // Shapes gpipe never runs are derived from their parts: F&B = F + B, F+F = 2 F, W (unmeasured) = 0.
  EXPECT_NEAR(cal.costs.issue[sched::op_shape(sched::parse_op("F1.2&B1.1"))], 12e-3, 1e-12);
  EXPECT_NEAR(cal.costs.issue[sched::op_shape(sched::parse_op("F0.1+F0.2"))], 14e-3, 1e-12);
  EXPECT_EQ(cal.issue_samples[4], 0);
  // all-reduces: min(8, 6) = 6 and min(10, 9) = 9 -> mean 7.5 µs, 2 per part -> 15 µs.
  EXPECT_EQ(cal.costs.units, 2);
  EXPECT_NEAR(cal.costs.tar, 15e-3, 1e-12);
  EXPECT_EQ(cal.all_reduces, 2);
  EXPECT_NEAR(cal.costs.tp2p, 0, 1e-12);  // pp 1: no messages
}

TEST(Calibrate, ATraceOfAnotherScheduleIsAnError) {
  sched::Costs c;
  auto trace = stp::profile::parse_trace(simulated_trace(sched::generate("1f1b", 2, 4), c, 1), "simulated");
  auto ranks = stp::profile::timelines(trace);
  EXPECT_THROW(stp::profile::calibrate(trace, ranks, sched::generate("gpipe", 2, 8), 1), stp::Error);
  EXPECT_THROW(stp::profile::calibrate(trace, ranks, sched::generate("1f1b", 2, 4), 2), stp::Error);  // no rank 2, 3
}

TEST(Calibrate, SimFlagsAreWhatStpSimAccepts) {
  sched::Costs c;
  c.tf = 4.25, c.tb = 5, c.tw = 2.5, c.tar = 8.125, c.tp2p = 0.25, c.units = 2;
  EXPECT_EQ(stp::profile::sim_flags(c), "--tf 4.25 --tb 5 --tw 2.5 --tar 8.125 --tp2p 0.25 --units 2");
  c.issue[0] = 0.5, c.issue[4] = 3.125;
  EXPECT_EQ(stp::profile::sim_flags(c),
            "--tf 4.25 --tb 5 --tw 2.5 --tar 8.125 --tp2p 0.25 --units 2 --issue 'F=0.5,F&B=3.125'");
}

}  // namespace
