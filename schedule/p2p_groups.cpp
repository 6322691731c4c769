#include "schedule/p2p_groups.h"

#include <algorithm>
#include <set>

#include "base/error.h"

namespace stp::sched {

P2pChannel channel_of(const Message& m) { return {m.src, m.dst, m.pass == Pass::F ? Pass::F : Pass::B}; }

std::string to_string(const P2pChannel& c) {
  return str(c.pass == Pass::F ? "activations " : "gradients ", c.src, "->", c.dst);
}

std::vector<P2pChannel> p2p_channels(const Schedule& s, int rank) {
  std::set<P2pChannel> all;
  for (int r = 0; r < s.pp; ++r)
    for (const Op& op : s.ranks[static_cast<std::size_t>(r)]) {
      OpMessages msgs = op_messages(s, r, op);
      for (const auto* list : {&msgs.send, &msgs.recv})
        for (const Message& m : *list)
          if (m.src != m.dst && (rank < 0 || m.src == rank || m.dst == rank)) all.insert(channel_of(m));
    }
  return {all.begin(), all.end()};
}

namespace {

// The distinct channels of `ops`, in the order of their first operation.
std::vector<P2pChannel> channels_of(const std::vector<P2pPending>& ops) {
  std::vector<P2pChannel> out;
  for (const P2pPending& p : ops) {
    P2pChannel c = channel_of(p.message);
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

}  // namespace

void post_receives(P2pSink& sink, std::vector<P2pPending> recv) {
  for (P2pPending& p : recv) p.issue();
  for (const P2pChannel& c : channels_of(recv)) sink.compute_waits_for_p2p(c);
}

void post_sends(P2pSink& sink, std::vector<P2pPending> send) {
  for (const P2pChannel& c : channels_of(send)) sink.p2p_waits_for_compute(c);
  for (P2pPending& p : send) p.issue();
}

}  // namespace stp::sched
