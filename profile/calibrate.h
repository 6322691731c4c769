// Simulator costs (schedule/simulator.h) calibrated from a traced run — the one implementation
// behind `stp profile` and tools/bench_train.
//
// The simulator sees a TP group as one device whose chunk-pass costs T_F, T_B, T_W occupy its
// compute stream, each followed by `units` all-reduces of T_AR/units, and a cross-rank message
// arriving T_P2P after the op that produced it ended. The trace gives each of these directly:
//
//   unit occupancy  A compute unit's span plus the issue gaps around it: idle compute time with
//                   nothing in flight on the rank (no all-reduce, P2P or copy; overlap.h). The
//                   leading part of a gap (before anything starts) delays what the previous unit
//                   enqueued next — its all-reduce too — so it is charged to the previous unit;
//                   the rest (after what the next unit waited for) to the next unit. Idle time
//                   under an all-reduce or a message is not occupancy: the simulator produces it.
//   TP group        An all-reduce ends when its slowest member arrives, so the group moves at its
//                   slowest member's pace: a unit costs the maximum occupancy over the TP ranks
//                   (units matched by step, op and position in the op), and an all-reduce costs the
//                   minimum of its spans over the TP ranks (the transfer after the last arrival;
//                   the other spans include waiting for that member, already in its occupancy).
//   T_F, T_B, T_W   mean over every part (one pass of one chunk for one microbatch, args "part")
//                   of the summed occupancy of its F, B resp. W units; a fused W (a B part without
//                   '*') counts in T_W, as the simulator's B = T_B + T_W.
//   units, T_AR     units = median all-reduces per part that has any (2 per transformer layer);
//                   T_AR = units × mean all-reduce cost. Without TP: T_AR = 0, units = 2.
//   T_P2P           mean over received messages that the consumer waited for (its previous op had
//                   ended before the producing op ended) of: receive span end − producing op end.
//   copy bandwidth  bytes / time of the D2H and H2D spans (GB/s, 1e9 B/s).
// Ops are matched to the schedule by position: the k-th op span of a rank in a step is
// schedule.ranks[pp_rank][k]; a mismatch is an stp::Error (the trace is not of this schedule).
// Global rank g = pp_rank · tp + tp_rank, as `stp train` numbers them.
#pragma once

#include <string>
#include <vector>

#include "profile/timeline.h"
#include "schedule/schedule.h"
#include "schedule/simulator.h"

namespace stp::profile {

struct Calibration {
  sched::Costs costs;                  // ms per chunk-pass
  double d2h_gbps = 0, h2d_gbps = 0;   // 0: no copies traced
  int parts = 0, all_reduces = 0, messages = 0;  // samples behind the costs
  int steps = 0;
};

// `ranks` = timelines(trace).
Calibration calibrate(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& schedule,
                      int tp, const StepFilter& filter = {});

// The costs as `stp sim` flags: "--tf 4.21 --tb 4.72 --tw 2.94 --tar 8.37 --tp2p 0.35 --units 2".
std::string sim_flags(const sched::Costs& c);

}  // namespace stp::profile
