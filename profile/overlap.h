// Where each rank's time went, measured from its spans (all times in ms, summed over the steps
// analysed). Per step window (timeline.h), with compute = ∪ of F/B/W unit spans and pipeline
// span = from the first op's start (when its inputs had arrived; the first unit's start if the
// trace has no op spans) to the end of the last unit or op (an op ends after its tail all-reduce):
//
//   busy            |compute|                                    compute_busy_fraction = busy / span
//   tp              |∪ tp-comm spans ∩ window|                   tp_exposed   = |tp \ compute| within span
//   p2p             |∪ p2p spans ∩ window|                       p2p_exposed  = |p2p \ compute| within span
//   bubble          span − busy − tp_exposed: compute idle with no all-reduce in flight (the
//                   simulator's pp_bubble). It splits by what else is in flight, in this order:
//     p2p_wait      a send or receive (waiting for a pipeline neighbour),
//     copy_stall    only D2H/H2D copies (compute waits for an offload or reload),
//     issue_gap     nothing at all: the stream ran dry because the host had not enqueued the next
//                   work yet (launch overhead; large on the CPU backend when cores are shared).
//   d2h/h2d         bytes (span args), |∪ spans| and achieved GB/s = bytes / time (1e9 B/s);
//   copy_hidden_fraction = |(d2h ∪ h2d) ∩ compute| / |d2h ∪ h2d| within the window.
//   lane_busy       |∪ spans| of each lane within the window (compute: the units).
// A p2p receive's span includes its wait for the sender, so p2p_exposed overlaps the bubble; the
// two are not additive. Spans starting in a window count in it; intervals are clipped to it.
#pragma once

#include <array>
#include <cstdint>

#include "profile/intervals.h"
#include "profile/timeline.h"

namespace stp::profile {

struct RankTimes {
  int pid = 0;
  int steps = 0;       // windows analysed
  double step_ms = 0;  // Σ window lengths
  double span_ms = 0, busy_ms = 0;
  double tp_ms = 0, tp_exposed_ms = 0;
  double p2p_ms = 0, p2p_exposed_ms = 0;
  double bubble_ms = 0, p2p_wait_ms = 0, copy_stall_ms = 0, issue_gap_ms = 0;
  double d2h_bytes = 0, h2d_bytes = 0, d2h_ms = 0, h2d_ms = 0;
  double copy_ms = 0, copy_hidden_ms = 0;  // |d2h ∪ h2d|, its part under compute
  std::array<double, kLanes> lane_busy_ms{};

  double busy_fraction() const { return span_ms > 0 ? busy_ms / span_ms : 0; }
  double d2h_gbps() const { return d2h_ms > 0 ? d2h_bytes / (d2h_ms * 1e6) : 0; }
  double h2d_gbps() const { return h2d_ms > 0 ? h2d_bytes / (h2d_ms * 1e6) : 0; }
  double copy_hidden_fraction() const { return copy_ms > 0 ? copy_hidden_ms / copy_ms : 0; }
  RankTimes& operator+=(const RankTimes& o);  // totals over ranks (pid and steps kept)
};

RankTimes measure(const RankTimeline& rank, const StepFilter& filter = {});

// The pipeline span of one step window in µs; {0, 0} when the window has no compute unit.
Interval pipeline_extent(const RankTimeline& rank, const StepWindow& w);

}  // namespace stp::profile
