// How one rank's pipeline sends and receives are posted: the rules the executor
// (train/executor.cpp) runs and the deadlock checker (schedule/deadlock.h) replays, so both see
// the same operations, streams and stream waits.
//
// Channels. Every pipeline message travels on a channel: one direction (source rank → destination
// rank) and one message kind (activations, gradients). Each channel is its own 2-rank communicator
// with its own p2p stream on both ends (group rank 0 = the source, 1 = the destination), so a
// channel stream only sends (on the source) or only receives (on the destination), and its
// messages arrive first in, first out. A send that blocks until the peer's receive runs then holds
// up only later sends of its own channel, never a receive: no two neighbours can each wait on a
// send to the other (docs/gpu-readiness.md section 8, crossed sends).
//
// Rules, for op k of a rank (no communicator group is ever left open across ops or calls):
//   * post_receives (op k's receives): each is issued at once on its channel's stream, in
//     posting order; then compute waits for every channel stream that received (op k's inputs);
//   * post_sends (op k's sends): every channel stream that sends waits for compute (the data to
//     send), then each send is issued at once on its channel's stream, in posting order.
// Channels are independent: nothing on one channel stream waits for another, so no operation is
// kept on the host and nothing needs an NCCL group (each is one ncclSend or ncclRecv).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace stp::sched {

struct P2pChannel {
  int src = 0, dst = 0;  // pipeline ranks
  Pass pass = Pass::F;   // F: activations; B: gradients
  auto operator<=>(const P2pChannel&) const = default;
};
P2pChannel channel_of(const Message& m);     // pass F stays F; B (and anything else) is B
std::string to_string(const P2pChannel& c);  // "activations 0->1", "gradients 1->0"

// The channels the messages of `s` use (hand-overs on one rank are not messages), sorted; with
// rank >= 0 only those where `rank` is the source or the destination. Every rank that creates
// communicators iterates the full list in this order.
std::vector<P2pChannel> p2p_channels(const Schedule& s, int rank = -1);

// What the posting drives: the executor's channel communicators and streams, or a recording.
class P2pSink {
 public:
  virtual ~P2pSink() = default;
  virtual void p2p_waits_for_compute(const P2pChannel& c) = 0;  // c's stream waits for compute so far
  virtual void compute_waits_for_p2p(const P2pChannel& c) = 0;  // compute waits for c's stream so far
};

// One send or receive; `issue` makes the communicator call on the channel of `message`.
struct P2pPending {
  Message message;
  bool send = false;
  std::function<void()> issue;
};

void post_receives(P2pSink& sink, std::vector<P2pPending> recv);
void post_sends(P2pSink& sink, std::vector<P2pPending> send);

}  // namespace stp::sched
