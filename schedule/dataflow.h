// The dependency walk shared by the validator (deadlock check) and the simulator (timing): ranks run their
// ops strictly in order; an op may run once every input of every part has been produced (schedule.h, "Data
// flow"). P2P sends are buffered, so a rank never blocks on a send. The walk is event-driven: a rank that
// stalls registers on the one output it waits for and is woken when that output is produced, so the cost is
// linear in the number of ops.
#pragma once

#include <functional>
#include <vector>

#include "schedule/schedule.h"

namespace stp::sched {

// Dense index of the output of pass `pass` of `stage` for microbatch `mb` (1-based).
struct DataKey {
  int n_stages = 0;
  int microbatches = 0;
  int operator()(Pass pass, int stage, int mb) const {
    return (static_cast<int>(pass) * n_stages + stage) * microbatches + (mb - 1);
  }
  int size() const { return 3 * n_stages * microbatches; }
};

// Key of the output a part needs before it can run (−1: none, the first stage's forward).
int input_key(const Schedule& s, const DataKey& key, int rank, const Part& part);
// Key of the output a part produces.
int output_key(const Schedule& s, const DataKey& key, int rank, const Part& part);

// Calls visit(rank, op_index) for every op, each after all its inputs were produced. Throws stp::Error
// naming every stalled rank's op and what it waits for when the schedule deadlocks (a dependency cycle,
// or an input no op produces). Assumes the structural checks of validate() passed (indices in range).
void walk_dataflow(const Schedule& s, const std::function<void(int rank, int op)>& visit);

}  // namespace stp::sched
