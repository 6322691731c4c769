// Deadlock check of the pipeline's point-to-point traffic as a GPU would run it (`stp sim
// --check-deadlock`, docs/schedules.md, Deadlock check).
//
// Each rank's op list is replayed through the executor's own posting rules (schedule/p2p_groups.h,
// the code train/executor.cpp runs), which yields per rank in-order streams:
//   compute  the ops, each behind a wait for the p2p streams that received its inputs;
//   p2p      P2pStreams::PerChannel (what the executor does): one stream per channel the rank
//            sends or receives on; P2pStreams::Shared: every channel on one p2p stream per rank
//            (the executor's former single stream, without its former groups: why channels are
//            needed). Items: waits for compute (before sends) and one kernel per send or receive.
// Rendezvous semantics: a kernel completes only when, for each of its sends and receives, the
// peer's kernel holding the matching operation is running (at the head of its stream) or done;
// nothing is buffered. Messages match first-in first-out per channel (source, destination, kind).
// TP all-reduces are not modelled: they run on their own stream and communicator, and the ranks of
// a TP group run the same ops in the same order, so p2p posting is the same for every tp.
#pragma once

#include <string>
#include <vector>

#include "schedule/p2p_groups.h"
#include "schedule/schedule.h"

namespace stp::sched {

struct P2pOp {
  Message message;
  bool send = false;
  std::string op;  // the op string that posts it ("F0.3")
};

struct StreamItem {
  enum class Kind { Wait, Kernel, Compute } kind = Kind::Compute;
  int stream = 0;          // Wait: the rank's stream waited for (index into RankStreams::streams)
  int count = 0;           // Wait: items of that stream that must have completed
  std::vector<P2pOp> ops;  // Kernel
  std::string op;          // Compute: the op string
};

struct RecordedStream {
  std::string name;  // the executor's stream names (base/trace_names.h): compute, p2p <channel>, p2p
  std::vector<StreamItem> items;
};

struct RankStreams {
  std::vector<RecordedStream> streams;  // [0] = compute, then the p2p streams
};

enum class P2pStreams {
  PerChannel,  // one stream per channel (the executor)
  Shared,      // one p2p stream per rank for every channel (crossed sends deadlock)
};

struct DeadlockOptions {
  P2pStreams streams = P2pStreams::PerChannel;
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

// The host side of a channel's first transfer: if connecting a channel makes each end's host
// thread wait until the peer's host thread reaches its own first operation on that channel, the
// ranks' first uses must agree. Replays each rank's channels in the order its op list first uses
// them (the order the executor issues them) as rendezvous; ok when every rank gets through.
DeadlockResult find_connect_deadlock(const Schedule& s);

std::string to_string(const P2pOp& op);
std::string describe(const StreamItem& item);

}  // namespace stp::sched
