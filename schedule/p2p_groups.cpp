#include "schedule/p2p_groups.h"

namespace stp::sched {

void P2pGrouping::receives(std::vector<Pending> recv) {
  if (recv.empty()) return;
  if (!open_) {
    open_ = true;
    sink_.group_begin();
  }
  add(std::move(recv));
  close();
  sink_.compute_waits_for_p2p();
}

void P2pGrouping::before_collective() {
  if (open_) close(/*notify=*/false);  // in the middle of an op: nothing else may start here
}

void P2pGrouping::sends(std::vector<Pending> send) {
  if (send.empty()) return;
  sink_.p2p_waits_for_compute();
  if (open_) close();
  open_ = true;
  sink_.group_begin();
  add(std::move(send));
}

void P2pGrouping::finish() {
  if (open_) close();
}

void P2pGrouping::add(std::vector<Pending> ops) {
  for (Pending& p : ops) {
    if (sink_.defers()) pending_.push_back(std::move(p));
    else p.issue();
  }
}

void P2pGrouping::close(bool notify) {
  std::vector<Pending> ops;
  std::swap(ops, pending_);
  open_ = false;
  for (Pending& p : ops) p.issue();  // in posting order: op k's sends, then op k+1's receives
  sink_.group_end();
  if (notify) sink_.group_closed();
  // `ops` (and what its closures hold, e.g. send buffers) is released only now, after the
  // group's end enqueued the operations.
}

}  // namespace stp::sched
