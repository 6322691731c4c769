#include "schedule/deadlock.h"

#include <map>
#include <set>
#include <tuple>

#include "base/error.h"
#include "base/trace_names.h"

namespace stp::sched {

namespace {

// Records what the posting enqueues: one kernel per operation on its stream, and stream waits.
class Recorder final : public P2pSink {
 public:
  Recorder(RankStreams& out, int rank, const Schedule& s, P2pStreams layout) : out_(out), layout_(layout) {
    out_.streams.push_back({trace::stream::kCompute, {}});
    if (layout_ == P2pStreams::Shared) {
      out_.streams.push_back({trace::stream::kP2p, {}});
      return;
    }
    for (const P2pChannel& c : p2p_channels(s, rank)) {
      index_[c] = static_cast<int>(out_.streams.size());
      out_.streams.push_back({trace::p2p_channel_stream(to_string(c)), {}});
    }
  }
  void p2p_waits_for_compute(const P2pChannel& c) override { wait(stream_of(c), 0); }
  void compute_waits_for_p2p(const P2pChannel& c) override { wait(0, stream_of(c)); }
  void issued(P2pOp op) {
    StreamItem k;
    k.kind = StreamItem::Kind::Kernel;
    int s = stream_of(channel_of(op.message));
    k.ops.push_back(std::move(op));
    items(s).push_back(std::move(k));
  }
  void computed(std::string op) {
    StreamItem c;
    c.op = std::move(op);
    items(0).push_back(std::move(c));
  }

 private:
  std::vector<StreamItem>& items(int s) { return out_.streams[static_cast<std::size_t>(s)].items; }
  int stream_of(const P2pChannel& c) {
    if (layout_ == P2pStreams::Shared) return 1;
    auto it = index_.find(c);
    STP_ASSERT(it != index_.end(), "no stream for channel ", to_string(c));
    return it->second;
  }
  void wait(int waiter, int on) {  // `waiter` waits for everything enqueued on `on` so far
    StreamItem w;
    w.kind = StreamItem::Kind::Wait;
    w.stream = on;
    w.count = static_cast<int>(items(on).size());
    items(waiter).push_back(std::move(w));
  }

  RankStreams& out_;
  P2pStreams layout_;
  std::map<P2pChannel, int> index_;
};

std::vector<P2pPending> pending(Recorder& rec, const std::vector<Message>& msgs, bool send, const std::string& op) {
  std::vector<P2pPending> out;
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
    case StreamItem::Kind::Wait: return str("wait for the first ", item.count, " items of stream ", item.stream);
    case StreamItem::Kind::Compute: return str(trace::stream::kCompute, " ", item.op);
    case StreamItem::Kind::Kernel: break;
  }
  std::string s = "kernel [";
  for (std::size_t i = 0; i < item.ops.size(); ++i) s += str(i ? ", " : "", to_string(item.ops[i]));
  return s + "]";
}

// Mirrors Executor::run_step: receives, compute, sends, through the same posting rules.
std::vector<RankStreams> record_streams(const Schedule& s, const DeadlockOptions& options) {
  std::vector<RankStreams> out(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    Recorder rec(out[static_cast<std::size_t>(r)], r, s, options.streams);
    for (const Op& op : s.ranks[static_cast<std::size_t>(r)]) {
      std::string name = to_string(op);
      OpMessages msgs = op_messages(s, r, op);
      post_receives(rec, pending(rec, msgs.recv, false, name));
      rec.computed(name);
      post_sends(rec, pending(rec, msgs.send, true, name));
    }
  }
  return out;
}

DeadlockResult find_deadlock(const std::vector<RankStreams>& ranks) {
  const int n = static_cast<int>(ranks.size());
  auto stream_of = [&](int r, int s) -> const RecordedStream& {
    return ranks[static_cast<std::size_t>(r)].streams[static_cast<std::size_t>(s)];
  };
  auto item_of = [&](int r, int s, int i) -> const StreamItem& {
    return stream_of(r, s).items[static_cast<std::size_t>(i)];
  };
  // Where each operation sits, and its match on the peer (first in, first out per channel).
  struct Where {
    int rank = -1, stream = -1, item = -1, op = -1;
  };
  std::map<std::tuple<int, int, int, bool>, std::vector<Where>> queues;  // (src, dst, pass, send)
  std::map<std::tuple<int, int, int, int>, Where> match;                 // (rank, stream, item, op) -> peer
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < static_cast<int>(ranks[static_cast<std::size_t>(r)].streams.size()); ++s)
      for (int i = 0; i < static_cast<int>(stream_of(r, s).items.size()); ++i)
        for (int j = 0; j < static_cast<int>(item_of(r, s, i).ops.size()); ++j) {
          const P2pOp& p = item_of(r, s, i).ops[static_cast<std::size_t>(j)];
          P2pChannel c = channel_of(p.message);
          queues[{c.src, c.dst, static_cast<int>(c.pass), p.send}].push_back({r, s, i, j});
          match[{r, s, i, j}] = Where{};
        }
  for (auto& [key, sends] : queues) {
    auto [src, dst, pass, is_send] = key;
    if (!is_send) continue;
    auto it = queues.find({src, dst, pass, false});
    const std::vector<Where> none;
    const std::vector<Where>& recvs = it == queues.end() ? none : it->second;
    for (std::size_t k = 0; k < sends.size() && k < recvs.size(); ++k) {
      const Where &a = sends[k], &b = recvs[k];
      match[{a.rank, a.stream, a.item, a.op}] = b;
      match[{b.rank, b.stream, b.item, b.op}] = a;
    }
  }
  for (const auto& [at, peer] : match)
    if (peer.rank < 0) {
      auto [r, s, i, j] = at;
      return {false, str("rank ", r, ": ", to_string(item_of(r, s, i).ops[static_cast<std::size_t>(j)]),
                         " has no matching operation on its peer")};
    }

  // Replay: done[r][s] = completed items of rank r's stream s.
  std::vector<std::vector<int>> done(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    done[static_cast<std::size_t>(r)].assign(ranks[static_cast<std::size_t>(r)].streams.size(), 0);
  auto done_of = [&](int r, int s) -> int& { return done[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)]; };
  auto size_of = [&](int r, int s) { return static_cast<int>(stream_of(r, s).items.size()); };
  // The first operation of the head kernel of (r, s) whose peer kernel is not running yet (−1: none).
  auto blocked_op = [&](int r, int s) {
    const StreamItem& it = item_of(r, s, done_of(r, s));
    for (int j = 0; j < static_cast<int>(it.ops.size()); ++j) {
      const Where& m = match.at({r, s, done_of(r, s), j});
      if (done_of(m.rank, m.stream) < m.item) return j;
    }
    return -1;
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < static_cast<int>(done[static_cast<std::size_t>(r)].size()); ++s)
        for (;;) {
          int& d = done_of(r, s);
          if (d == size_of(r, s)) break;
          const StreamItem& it = item_of(r, s, d);
          if (it.kind == StreamItem::Kind::Wait && done_of(r, it.stream) < it.count) break;
          if (it.kind == StreamItem::Kind::Kernel && blocked_op(r, s) >= 0) break;
          ++d;
          progressed = true;
        }
  }
  std::pair<int, int> stuck{-1, -1};
  for (int r = 0; r < n && stuck.first < 0; ++r)
    for (int s = 0; s < static_cast<int>(done[static_cast<std::size_t>(r)].size()) && stuck.first < 0; ++s)
      if (done_of(r, s) < size_of(r, s)) stuck = {r, s};
  if (stuck.first < 0) return {};

  // Wait-for graph over stream heads. Every blocked head waits for another blocked head, so
  // following the edges from any blocked head ends in a cycle.
  auto name = [&](int r, int s) { return str("rank ", r, " ", stream_of(r, s).name); };
  auto next = [&](std::pair<int, int> node, std::string* why) -> std::pair<int, int> {
    auto [r, s] = node;
    const StreamItem& it = item_of(r, s, done_of(r, s));
    if (it.kind == StreamItem::Kind::Wait) {
      const StreamItem* after = done_of(r, s) + 1 < size_of(r, s) ? &item_of(r, s, done_of(r, s) + 1) : nullptr;
      *why = str(name(r, s), ": ", after ? describe(*after) : std::string("the next item"), " waits for ",
                 name(r, it.stream));
      return {r, it.stream};
    }
    int j = blocked_op(r, s);
    const Where& peer = match.at({r, s, done_of(r, s), j});
    const P2pOp& mine = it.ops[static_cast<std::size_t>(j)];
    const P2pOp& theirs = item_of(peer.rank, peer.stream, peer.item).ops[static_cast<std::size_t>(peer.op)];
    *why = str(name(r, s), ": ", describe(it), " cannot complete ", to_string(mine), ": ", name(peer.rank, peer.stream),
               "'s matching ", to_string(theirs), " is queued behind that stream's earlier work");
    return {peer.rank, peer.stream};
  };
  std::pair<int, int> node = stuck;
  std::vector<std::string> whys;
  std::map<std::pair<int, int>, std::size_t> seen;
  while (!seen.count(node)) {
    STP_ASSERT(done_of(node.first, node.second) < size_of(node.first, node.second),
               "deadlock walk reached a stream that is not blocked");
    seen[node] = whys.size();
    std::string why;
    std::pair<int, int> to = next(node, &why);
    whys.push_back(why);
    node = to;
  }
  std::string msg = "deadlock: a cycle of waits (rendezvous semantics):";
  for (std::size_t i = seen[node]; i < whys.size(); ++i) msg += str("\n  ", whys[i]);
  return {false, msg};
}

DeadlockResult find_connect_deadlock(const Schedule& s) {
  std::vector<std::vector<std::pair<P2pChannel, std::string>>> firsts(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    std::set<P2pChannel> seen;
    for (const Op& op : s.ranks[static_cast<std::size_t>(r)]) {
      OpMessages msgs = op_messages(s, r, op);
      for (const auto* list : {&msgs.recv, &msgs.send})  // the executor's issue order within an op
        for (const Message& m : *list)
          if (m.src != m.dst && seen.insert(channel_of(m)).second)
            firsts[static_cast<std::size_t>(r)].push_back({channel_of(m), to_string(op)});
    }
  }
  std::vector<std::size_t> at(static_cast<std::size_t>(s.pp), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& mine = firsts[static_cast<std::size_t>(r)];
      if (at[static_cast<std::size_t>(r)] == mine.size()) continue;
      const P2pChannel c = mine[at[static_cast<std::size_t>(r)]].first;
      const int peer = c.src == r ? c.dst : c.src;
      const auto& theirs = firsts[static_cast<std::size_t>(peer)];
      if (at[static_cast<std::size_t>(peer)] < theirs.size() && theirs[at[static_cast<std::size_t>(peer)]].first == c) {
        ++at[static_cast<std::size_t>(r)];
        ++at[static_cast<std::size_t>(peer)];
        progressed = true;
      }
    }
  }
  std::string msg;
  for (int r = 0; r < s.pp; ++r) {
    const auto& mine = firsts[static_cast<std::size_t>(r)];
    if (at[static_cast<std::size_t>(r)] < mine.size())
      msg += str(msg.empty() ? "" : "; ", "rank ", r, " waits to connect ",
                 to_string(mine[at[static_cast<std::size_t>(r)]].first), " (",
                 mine[at[static_cast<std::size_t>(r)]].second, ")");
  }
  if (msg.empty()) return {};
  return {false, "connection deadlock: " + msg};
}

}  // namespace stp::sched
