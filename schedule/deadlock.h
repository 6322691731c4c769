// Deadlock check of the pipeline's point-to-point traffic as a GPU would run it (`stp sim
// --check-deadlock`, docs/schedules.md, Deadlock check).
//
// Each rank's op list is replayed through the executor's own grouping rules (schedule/p2p_groups.h,
// the code train/executor.cpp runs), which yields per rank two in-order streams:
//   p2p      waits for compute, and group kernels. GroupRule::JoinOrder (NCCL before 2.26): one
//            kernel per communicator (lane) with operations in the group, in the order the group
//            joined the communicators; GroupRule::Together (2.26 and later): one unit per group;
//   compute  the ops, each behind a wait for the p2p work that received its inputs.
// Rendezvous semantics: a kernel completes only when, for each of its sends and receives, the
// peer's kernel holding the matching operation is running (at the head of the peer's p2p stream)
// or done; nothing is buffered. Messages match first-in first-out per (sender, receiver, lane).
// TP all-reduces are not modelled as waits (the ranks of a TP group run the same ops in the same
// order); with `tp_collectives` an op with an F or B part closes an open group before its compute,
// as the executor does before the op's first all-reduce.
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace stp::sched {

struct P2pOp {
  Message message;
  bool send = false;
  std::string op;  // the op string that posts it ("F0.3")
};

struct StreamItem {
  enum class Kind { Wait, Kernel, Compute } kind = Kind::Compute;
  int count = 0;           // Wait: items of the rank's other stream that must have completed
  int lane = 0;            // Kernel: the communicator (p2p_lane); −1: every lane of the group
  std::vector<P2pOp> ops;  // Kernel
  std::string op;          // Compute: the op string
};

struct RankStreams {
  std::vector<StreamItem> p2p, compute;
};

// How NCCL runs a group that spans the two lane communicators on one stream.
enum class GroupRule {
  JoinOrder,  // before NCCL 2.26: one kernel per communicator, in the order the group joined them
  Together,   // NCCL 2.26 and later (what stp requires): the group's operations progress together
};

struct DeadlockOptions {
  bool tp_collectives = false;  // tp > 1: F and B ops all-reduce (closing an open group first)
  GroupRule rule = GroupRule::Together;
};

struct DeadlockResult {
  bool ok = true;
  std::string message;  // when !ok: the first cycle (or unmatched operation), naming the ops
};

// The streams the executor enqueues on each rank for one step of `s`.
std::vector<RankStreams> record_streams(const Schedule& s, const DeadlockOptions& options);
// Replays the streams with rendezvous semantics.
DeadlockResult find_deadlock(const std::vector<RankStreams>& ranks);
inline DeadlockResult find_deadlock(const Schedule& s, const DeadlockOptions& options) {
  return find_deadlock(record_streams(s, options));
}

std::string to_string(const P2pOp& op);
std::string describe(const StreamItem& item);

}  // namespace stp::sched
