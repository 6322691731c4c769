// How one rank's pipeline sends and receives become communicator groups on its p2p stream: the
// rules the executor (train/executor.cpp) runs and the deadlock checker (schedule/deadlock.h)
// replays, so both see the same groups, lanes and stream waits.
//
// Rules (docs/schedules.md, Deadlock check; docs/gpu-readiness.md, finding 4):
//   * receives(op k): the receives join the group still open with op k−1's sends (or a new one);
//     the group is closed and compute waits for p2p (the received data);
//   * before_collective(): an open group is closed before any other NCCL call of the thread (an
//     NCCL group spans every call of the thread until its end, so a TP all-reduce inside it would
//     be enqueued late);
//   * sends(op k): p2p waits for compute (the data to send); an open group is closed; a new group
//     holds the sends and stays open for op k+1's receives;
//   * finish(): closes an open group at the end of the step.
// With a deferring sink, operations are kept on the host while a group is open and issued when it
// closes, as NCCL would enqueue them; otherwise they are issued when posted. Either way in the
// order posted: a group's sends come before its receives. That order matters on in-order streams that
// run one operation at a time (the CPU backend's HostComm and MPI communicators: a receive waits
// for its message, so a send queued behind it would wait too); NCCL 2.26 and later, which stp
// requires, progresses a group's operations together whatever their order. Ranks join the two
// lane communicators in different orders (a rank's sends may be gradients, its receives
// activations); older NCCL runs one kernel per communicator in that order, which can deadlock
// (docs/gpu-readiness.md section 8, finding 4; `stp sim --check-deadlock --nccl-groups
// join-order`). A fixed lane order does not avoid that and would put receives before sends.
#pragma once

#include <functional>
#include <vector>

#include "schedule/schedule.h"

namespace stp::sched {

// The lane (pipeline communicator) a message travels on: 0 = activations, 1 = gradients.
inline int p2p_lane(const Message& m) { return m.pass == Pass::F ? 0 : 1; }

// What the grouping drives: the executor's communicators and streams, or a recording.
class P2pSink {
 public:
  virtual ~P2pSink() = default;
  virtual void group_begin() = 0;            // ncclGroupStart on every lane
  virtual void group_end() = 0;              // ncclGroupEnd: the group's operations are enqueued
  virtual void p2p_waits_for_compute() = 0;  // p2p waits for the compute work enqueued so far
  virtual void compute_waits_for_p2p() = 0;  // compute waits for the p2p work enqueued so far
  // Whether an open group's operations reach the stream only at its end (NCCL: they are kept and
  // issued at the close) or at the call (the CPU backend's communicators: issued when posted).
  virtual bool defers() const { return true; }
  // Called after a group end between ops (receives, sends, finish), before anything else is
  // enqueued; not when before_collective() closes a group in the middle of an op.
  virtual void group_closed() {}
};

class P2pGrouping {
 public:
  // One operation to issue when its group closes; `issue` makes the communicator call.
  struct Pending {
    Message message;
    bool send = false;
    std::function<void()> issue;
  };
  explicit P2pGrouping(P2pSink& sink) : sink_(sink) {}

  void receives(std::vector<Pending> recv);
  void before_collective();
  void sends(std::vector<Pending> send);
  void finish();
  bool open() const { return open_; }

 private:
  void add(std::vector<Pending> ops);
  void close(bool notify = true);

  P2pSink& sink_;
  bool open_ = false;
  std::vector<Pending> pending_;
};

}  // namespace stp::sched
