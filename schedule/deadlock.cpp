#include "schedule/deadlock.h"

#include <map>
#include <tuple>

#include "base/error.h"
#include "schedule/p2p_groups.h"

namespace stp::sched {

namespace {

const char* lane_name(int lane) {
  return lane == 0 ? "the activation lane" : lane == 1 ? "the gradient lane" : "both lanes";
}

// Records what the grouping enqueues: group kernels in join order, and stream waits.
class Recorder final : public P2pSink {
 public:
  Recorder(RankStreams& out, GroupRule rule) : out_(out), rule_(rule) {}
  void group_begin() override { group_.clear(); }
  void group_end() override {
    std::vector<int> joined;  // lanes in the order their first operation was issued
    for (const P2pOp& p : group_) {
      int lane = p2p_lane(p.message);
      bool seen = false;
      for (int l : joined) seen = seen || l == lane;
      if (!seen) joined.push_back(lane);
    }
    if (rule_ == GroupRule::Together && !group_.empty()) joined = {-1};
    for (int lane : joined) {
      StreamItem k;
      k.kind = StreamItem::Kind::Kernel;
      k.lane = lane;
      for (const P2pOp& p : group_)
        if (lane < 0 || p2p_lane(p.message) == lane) k.ops.push_back(p);
      out_.p2p.push_back(std::move(k));
    }
    group_.clear();
  }
  void p2p_waits_for_compute() override {
    out_.p2p.push_back({StreamItem::Kind::Wait, static_cast<int>(out_.compute.size()), 0, {}, {}});
  }
  void compute_waits_for_p2p() override {
    out_.compute.push_back({StreamItem::Kind::Wait, static_cast<int>(out_.p2p.size()), 0, {}, {}});
  }
  void issued(P2pOp op) { group_.push_back(std::move(op)); }

 private:
  RankStreams& out_;
  GroupRule rule_;
  std::vector<P2pOp> group_;
};

std::vector<P2pGrouping::Pending> pending(Recorder& rec, const std::vector<Message>& msgs, bool send,
                                          const std::string& op) {
  std::vector<P2pGrouping::Pending> out;
  for (const Message& m : msgs) out.push_back({m, send, [&rec, m, send, op] { rec.issued({m, send, op}); }});
  return out;
}

}  // namespace

std::string to_string(const P2pOp& p) {
  const Message& m = p.message;
  return str(p.send ? "send " : "recv ", to_string(m), p.send ? " to rank " : " from rank ", p.send ? m.dst : m.src,
             " (", p.op, ")");
}

std::string describe(const StreamItem& item) {
  switch (item.kind) {
    case StreamItem::Kind::Wait: return str("wait for the other stream's first ", item.count, " items");
    case StreamItem::Kind::Compute: return str("compute ", item.op);
    case StreamItem::Kind::Kernel: break;
  }
  std::string s = str("group kernel on ", lane_name(item.lane), " [");
  for (std::size_t i = 0; i < item.ops.size(); ++i) s += str(i ? ", " : "", to_string(item.ops[i]));
  return s + "]";
}

// Mirrors Executor::run_step: receives, compute (closing an open group before the op's first
// all-reduce when tp > 1), sends; the group left open is closed at the end of the step.
std::vector<RankStreams> record_streams(const Schedule& s, const DeadlockOptions& options) {
  std::vector<RankStreams> out(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    RankStreams& streams = out[static_cast<std::size_t>(r)];
    Recorder rec(streams, options.rule);
    P2pGrouping groups(rec);
    for (const Op& op : s.ranks[static_cast<std::size_t>(r)]) {
      std::string name = to_string(op);
      OpMessages msgs = op_messages(s, r, op);
      groups.receives(pending(rec, msgs.recv, false, name));
      bool reduces = false;
      for (int i = 0; i < op.n_parts(); ++i) reduces = reduces || op.part(i).pass != Pass::W;
      if (options.tp_collectives && reduces) groups.before_collective();
      streams.compute.push_back({StreamItem::Kind::Compute, 0, 0, {}, name});
      groups.sends(pending(rec, msgs.send, true, name));
    }
    groups.finish();
  }
  return out;
}

DeadlockResult find_deadlock(const std::vector<RankStreams>& ranks) {
  const int n = static_cast<int>(ranks.size());
  // Where each operation sits: (rank, p2p item), and its match on the peer (FIFO per channel and lane).
  struct Where {
    int rank, item, op;
  };
  std::map<std::tuple<int, int, int, bool>, std::vector<Where>> queues;  // (src, dst, lane, send)
  for (int r = 0; r < n; ++r) {
    const auto& p2p = ranks[static_cast<std::size_t>(r)].p2p;
    for (int i = 0; i < static_cast<int>(p2p.size()); ++i)
      for (int j = 0; j < static_cast<int>(p2p[static_cast<std::size_t>(i)].ops.size()); ++j) {
        const P2pOp& p = p2p[static_cast<std::size_t>(i)].ops[static_cast<std::size_t>(j)];
        queues[{p.message.src, p.message.dst, p2p_lane(p.message), p.send}].push_back({r, i, j});
      }
  }
  // match[rank][item][op] = the peer's p2p item holding the matching operation (−1: none).
  std::vector<std::vector<std::vector<Where>>> match(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (const StreamItem& it : ranks[static_cast<std::size_t>(r)].p2p)
      match[static_cast<std::size_t>(r)].push_back(std::vector<Where>(it.ops.size(), Where{-1, -1, -1}));
  for (auto& [key, sends] : queues) {
    auto [src, dst, lane, is_send] = key;
    if (!is_send) continue;
    auto it = queues.find({src, dst, lane, false});
    const std::vector<Where> none;
    const std::vector<Where>& recvs = it == queues.end() ? none : it->second;
    for (std::size_t k = 0; k < sends.size() && k < recvs.size(); ++k) {
      const Where &a = sends[k], &b = recvs[k];
      match[static_cast<std::size_t>(a.rank)][static_cast<std::size_t>(a.item)][static_cast<std::size_t>(a.op)] = b;
      match[static_cast<std::size_t>(b.rank)][static_cast<std::size_t>(b.item)][static_cast<std::size_t>(b.op)] = a;
    }
  }
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < match[static_cast<std::size_t>(r)].size(); ++i)
      for (std::size_t j = 0; j < match[static_cast<std::size_t>(r)][i].size(); ++j)
        if (match[static_cast<std::size_t>(r)][i][j].rank < 0)
          return {false, str("rank ", r, ": ", to_string(ranks[static_cast<std::size_t>(r)].p2p[i].ops[j]),
                             " has no matching operation on its peer")};

  // Replay: done[r] = completed items of rank r's p2p and compute streams.
  std::vector<int> p2p_done(static_cast<std::size_t>(n), 0), compute_done(static_cast<std::size_t>(n), 0);
  auto p2p_of = [&](int r) -> const std::vector<StreamItem>& { return ranks[static_cast<std::size_t>(r)].p2p; };
  auto compute_of = [&](int r) -> const std::vector<StreamItem>& { return ranks[static_cast<std::size_t>(r)].compute; };
  // The first operation of rank r's head kernel whose peer kernel is not running yet (−1: none).
  auto blocked_op = [&](int r) {
    const std::size_t head = static_cast<std::size_t>(p2p_done[static_cast<std::size_t>(r)]);
    const auto& m = match[static_cast<std::size_t>(r)][head];
    for (std::size_t j = 0; j < m.size(); ++j)
      if (p2p_done[static_cast<std::size_t>(m[j].rank)] < m[j].item) return static_cast<int>(j);
    return -1;
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < n; ++r) {
      for (;;) {  // compute stream
        int& c = compute_done[static_cast<std::size_t>(r)];
        if (c == static_cast<int>(compute_of(r).size())) break;
        const StreamItem& it = compute_of(r)[static_cast<std::size_t>(c)];
        if (it.kind == StreamItem::Kind::Wait && p2p_done[static_cast<std::size_t>(r)] < it.count) break;
        ++c;
        progressed = true;
      }
      for (;;) {  // p2p stream
        int& p = p2p_done[static_cast<std::size_t>(r)];
        if (p == static_cast<int>(p2p_of(r).size())) break;
        const StreamItem& it = p2p_of(r)[static_cast<std::size_t>(p)];
        if (it.kind == StreamItem::Kind::Wait && compute_done[static_cast<std::size_t>(r)] < it.count) break;
        if (it.kind == StreamItem::Kind::Kernel && blocked_op(r) >= 0) break;
        ++p;
        progressed = true;
      }
    }
  }
  int stuck = -1;
  for (int r = 0; r < n && stuck < 0; ++r)
    if (p2p_done[static_cast<std::size_t>(r)] < static_cast<int>(p2p_of(r).size()) ||
        compute_done[static_cast<std::size_t>(r)] < static_cast<int>(compute_of(r).size()))
      stuck = r;
  if (stuck < 0) return {};

  // Wait-for graph over stream heads: node = 2·rank + (0 p2p, 1 compute). Every blocked head waits
  // for another blocked head, so following the edges from any blocked head ends in a cycle.
  auto blocked = [&](int node) {
    int r = node / 2;
    return node % 2 == 0 ? p2p_done[static_cast<std::size_t>(r)] < static_cast<int>(p2p_of(r).size())
                         : compute_done[static_cast<std::size_t>(r)] < static_cast<int>(compute_of(r).size());
  };
  auto next = [&](int node, std::string* why) {
    int r = node / 2;
    if (node % 2 == 1) {
      const StreamItem& it = compute_of(r)[static_cast<std::size_t>(compute_done[static_cast<std::size_t>(r)])];
      *why = str("rank ", r, " compute: ", it.op.empty() ? "the next op" : it.op, " waits for its receives on rank ", r,
                 "'s p2p stream");
      return 2 * r;
    }
    const StreamItem& it = p2p_of(r)[static_cast<std::size_t>(p2p_done[static_cast<std::size_t>(r)])];
    if (it.kind == StreamItem::Kind::Wait) {
      *why = str("rank ", r, " p2p: the sends wait for rank ", r, "'s compute stream");
      return 2 * r + 1;
    }
    int j = blocked_op(r);
    const Where& peer =
        match[static_cast<std::size_t>(r)][static_cast<std::size_t>(p2p_done[static_cast<std::size_t>(r)])]
             [static_cast<std::size_t>(j)];
    const P2pOp& mine = it.ops[static_cast<std::size_t>(j)];
    const P2pOp& theirs = p2p_of(peer.rank)[static_cast<std::size_t>(peer.item)].ops[static_cast<std::size_t>(peer.op)];
    *why = str("rank ", r, " p2p: ", describe(it), " cannot complete ", to_string(mine), ": rank ", peer.rank,
               "'s matching ", to_string(theirs), " is queued behind its p2p stream's earlier work");
    return 2 * peer.rank;
  };
  int node = 2 * stuck;
  if (!blocked(node)) node = 2 * stuck + 1;
  std::vector<int> path;
  std::vector<std::string> whys;
  std::map<int, std::size_t> seen;
  while (!seen.count(node)) {
    STP_ASSERT(blocked(node), "deadlock walk reached a stream that is not blocked");
    seen[node] = path.size();
    path.push_back(node);
    std::string why;
    int to = next(node, &why);
    whys.push_back(why);
    node = to;
  }
  std::string msg = "deadlock: a cycle of waits (rendezvous semantics):";
  for (std::size_t i = seen[node]; i < path.size(); ++i) msg += str("\n  ", whys[i]);
  return {false, msg};
}

}  // namespace stp::sched
