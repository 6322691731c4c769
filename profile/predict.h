// Prediction vs measurement: the simulator run with costs calibrated from the same trace
// (calibrate.h), next to what the trace measured, per pipeline rank, per step (ms).
//
// Measured, per pp rank (mean over its TP ranks and the steps analysed; overlap.h):
//   span        the pipeline span (overlap.h: first unit start to last unit or op end);
//   busy        compute busy + issue gaps (the calibration charges issue gaps to the units, so the
//               simulator's busy includes them);
//   tp_exposed  exposed all-reduce time;
//   bubble      the rest: span − busy − tp_exposed (pipeline waits and copy stalls).
// makespan: from the step's first op start to its last op end over all ranks (the simulator's
// makespan), mean over steps. Predicted: the simulator's RankStats (span, busy, tp_exposed,
// pp_bubble) and makespan.
#pragma once

#include <vector>

#include "profile/calibrate.h"
#include "profile/timeline.h"
#include "schedule/schedule.h"
#include "schedule/simulator.h"

namespace stp::profile {

struct Versus {
  double measured = 0, predicted = 0;
  double error() const { return measured != 0 ? (predicted - measured) / measured : 0; }  // relative
};

// One pipeline rank's measured and predicted times (a block of `stp profile`'s prediction table).
struct RankVersus {
  int rank = 0;  // pp rank
  Versus span, busy, tp_exposed, bubble;
};

struct Prediction {
  Calibration calibration;
  sched::SimResult sim;
  Versus makespan;  // ms per step
  std::vector<RankVersus> ranks;
};

Prediction predict(const Trace& trace, const std::vector<RankTimeline>& ranks, const sched::Schedule& schedule, int tp,
                   const StepFilter& filter = {});

}  // namespace stp::profile
