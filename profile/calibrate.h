// Simulator costs (schedule/simulator.h) calibrated from a traced run — the one implementation
// behind `stp profile` and tools/bench/bench_train.
//
// The simulator sees a TP group as one device whose chunk-pass costs T_F, T_B, T_W occupy its
// compute stream, each followed by `units` all-reduces of T_AR/units, an op of shape k that first
// stalls issue[k] (launch overhead), and a cross-rank message arriving T_P2P after the op that
// produced it ended. The trace gives each of these directly:
//
//   issue gaps      Idle compute time with nothing in flight on the rank (no all-reduce, P2P or
//                   copy; overlap.h): the host had not enqueued the next work yet. Each gap counts
//                   for the op whose unit follows it (a gap between two ops for the later one).
//                   Idle time under an all-reduce or a message is not an issue gap: the simulator
//                   produces it from T_AR and T_P2P.
//   TP group        An all-reduce ends when its slowest member arrives, so the group moves at its
//                   slowest member's pace: a unit costs the maximum span over the TP ranks (units matched by step, op
//                   and position in the op), and an all-reduce the minimum of its spans over the TP ranks (the transfer
//                   after the last arrival; the other spans include waiting for that member).
//                   An op's issue gap is the sum over its units of the largest gap before each.
//   T_F, T_B, T_W   mean over every part (one pass of one chunk for one microbatch, args "part")
//                   of the summed spans of its F, B resp. W units; a fused W (a B part without
//                   '*') counts in T_W, as the simulator's B = T_B + T_W.
//   issue[k]        mean over ops of shape k of the op's issue gap. Host lag
//                   depends on the op's context (a braided block stalls the host more than a plain
//                   F), and it delays everything the op has not enqueued yet, so it is an op-level
//                   stall, not unit time that all-reduces could hide. Shapes the run never ran get
//                   the sum over their parts of the plain F, B/B* and W values.
//   units, T_AR     units = median all-reduces per part that has any (2 per transformer layer);
//                   T_AR = units × mean all-reduce cost. Without TP: T_AR = 0, units = 2.
//   T_P2P           mean over received messages that the consumer waited for (its previous op had
//                   ended before the producing op ended) of: receive span end − producing op end.
//   copy bandwidth  bytes / time of the D2H and H2D spans (GB/s, 1e9 B/s).
// Ops are matched to the schedule by position: the k-th op span of a rank in a step is
// schedule.ranks[pp_rank][k]; a mismatch is an stp::Error (the trace is not of this schedule).
// Global rank g = pp_rank · tp + tp_rank, as `stp train` numbers them.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "profile/timeline.h"
#include "schedule/schedule.h"
#include "schedule/simulator.h"

namespace stp::profile {

struct Calibration {
  sched::Costs costs;                                 // ms per chunk-pass; issue ms per op
  double d2h_gbps = 0, h2d_gbps = 0;                  // 0: no copies traced
  int parts = 0, all_reduces = 0, messages = 0;       // samples behind the costs
  std::array<int, sched::kOpShapes> issue_samples{};  // ops of each shape measured (0: derived)
  int steps = 0;
};

// `ranks` = timelines(trace).
Calibration calibrate(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& schedule,
                      int tp, const StepFilter& filter = {});

// The costs as `stp sim` flags: "--tf 4.21 --tb 4.72 --tw 2.94 --tar 8.37 --tp2p 0.35 --units 2
// --issue 'F=0.5,F&B=3.1'" (--issue only for non-zero overheads; quoted for the shell).
std::string sim_flags(const sched::Costs& c);

}  // namespace stp::profile
