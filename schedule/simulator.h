// Discrete-event simulator: predicts each rank's time and activation memory for a schedule.
//
// Cost model (all costs per chunk-pass, unitless; `stp sim` defaults tf = tb = tw = 1, tar = tp2p = 0):
//   * Each rank has a compute stream and a TP-communication stream (FIFO).
//   * A forward or input-gradient backward (B) of a chunk is `units` compute units (a transformer layer has
//     two: attention and MLP); each unit is followed by one all-reduce of tar/units on the TP stream. The
//     next unit of the *same* part waits for that all-reduce; units of other parts and W units do not
//     (docs/schedules.md, STP op lists). A W is tw, split into `units` pieces when braided.
//   * Ops lay their units out on the compute stream as the braided blocks do:
//       F        F u0, F u1, …                     every AR exposed            → tf + tar
//       B (W fused) B u0, W u0, B u1, W u1, …     AR hidden under W pieces    → tb + tw (+ max(0, tar − tw))
//       B*       B u0, B u1, …                     every AR exposed            → tb + tar
//       W        one unit                                                      → tw
//       F&B      F u_i, B u_i, [W u_i if fused]    ARs hidden by the other pass; a B* block's last AR is exposed
//       F&W      F u_i, W u_i                      F's ARs hidden under W pieces
//       F+F      F(a) u_i, F(b) u_i                only the last AR of the second forward is exposed
//   * An op of shape k (op_shape) first spends issue[k] (default 0) before its first unit: launch overhead.
//   * An op ends when its compute and its all-reduces are done (its outputs must be reduced before they are
//     sent); outputs go out then, and arrive tp2p later on another rank (0 on the same rank). An op starts
//     when its rank is free and every input has arrived (an executor receives before the op).
//
// Per rank: span = last end − first start; busy = compute work; tp_exposed = time inside ops the compute
// stream waits on all-reduces; pp_bubble = span − busy − tp_exposed (waits between ops for P2P inputs).
// Activation sets (one chunk-microbatch each, M_a): live = forwards done − backwards done, counted between
// ops (a braided block is one op); `peak_transient` counts inside ops (a block's forward allocates before
// its backward frees); `peak_residue` counts forwards done − weight gradients done (a deferred W keeps
// part of the set). Cost: linear in the number of ops.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace stp::sched {

// The eight op shapes (kind and W deferral), which index Costs::issue: F, B, B*, W, F&B, F&B*, F&W, F+F.
constexpr int kOpShapes = 8;
int op_shape(const Op& op);
const char* op_shape_name(int shape);  // "F", "B", "B*", "W", "F&B", "F&B*", "F&W", "F+F"

struct Costs {
  double tf = 1, tb = 1, tw = 1, tar = 0, tp2p = 0;
  int units = 2;  // compute units per pass per chunk (2 = one transformer layer: attention, MLP)
  // Issue overhead per op shape (default 0): time at the start of an op during which nothing of it
  // runs yet because its work has not been enqueued (a host-bound launch: negligible on GPUs, large
  // when emulated devices share CPU cores). It delays the op's units and all-reduces alike and
  // counts as busy time. `stp profile` calibrates it from the issue gaps of a trace.
  std::array<double, kOpShapes> issue{};
};
// Throws stp::Error naming the cost if one is negative or not finite, or units < 1.
void check_costs(const Costs& c);

struct OpTime {
  double start = 0, end = 0;
};

struct RankStats {
  int rank = 0;
  double start = 0, end = 0, span = 0, busy = 0, pp_bubble = 0, tp_exposed = 0;
  int peak_activation = 0;  // most live activation sets between ops
  int peak_transient = 0;   // most live activation sets inside an op
  int peak_residue = 0;     // most activation sets whose W has not run yet (F-to-W lifetimes)
};

struct SimResult {
  double makespan = 0;
  std::vector<RankStats> ranks;
  std::vector<std::vector<OpTime>> times;  // [rank][op] start/end, in each rank's op order
};

// Simulates a valid schedule (run validate() first; a deadlock throws stp::Error).
SimResult simulate(const Schedule& s, const Costs& c);

// The inside of one op started at `start` (its units begin after its issue overhead): compute units and
// all-reduces as laid out above. Used by the
// renderers and by memory planning to see activation lifetimes at unit granularity.
struct Segment {
  int stream = 0;  // 0 = compute, 1 = TP communication
  int part = 0;    // which part of the op
  Pass pass = Pass::F;
  double start = 0, end = 0;
};
std::vector<Segment> op_segments(const Op& op, const Costs& c, double start);

}  // namespace stp::sched
