// The pipeline deadlock check (schedule/deadlock.h): it finds a planted crossed-send ordering and
// names the ops of the cycle, finds the crossed sends of real schedules when every channel shares
// one p2p stream, and passes for every schedule, (pp, m) and layout with the executor's posting
// (schedule/p2p_groups.h: one stream per channel).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "schedule/deadlock.h"
#include "schedule/p2p_groups.h"

using namespace stp::sched;

namespace {

StreamItem kernel(P2pOp op) {
  StreamItem k;
  k.kind = StreamItem::Kind::Kernel;
  k.ops = {std::move(op)};
  return k;
}

RankStreams one_p2p_stream(std::vector<StreamItem> items) {
  RankStreams r;
  r.streams = {{"compute", {}}, {"p2p", std::move(items)}};
  return r;
}

// Stage 0 on rank 0 sends the activation of microbatch 2 and receives the gradient of
// microbatch 1; rank 1 (the last stage) does the opposite.
const Message kAct{Pass::F, 0, 1, 2, 0, 1};
const Message kGrad{Pass::B, 1, 0, 1, 1, 0};

}  // namespace

TEST(Deadlock, MatchedOrderRuns) {
  std::vector<RankStreams> r = {one_p2p_stream({kernel({kAct, true, "F0.2"}), kernel({kGrad, false, "B0.1"})}),
                                one_p2p_stream({kernel({kAct, false, "F0.2"}), kernel({kGrad, true, "B0.1"})})};
  DeadlockResult res = find_deadlock(r);
  EXPECT_TRUE(res.ok) << res.message;
}

// The planted case: each rank sends to the other before it posts the matching receive.
TEST(Deadlock, CrossedSendsAreACycleNamingTheOps) {
  std::vector<RankStreams> r = {one_p2p_stream({kernel({kAct, true, "F0.2"}), kernel({kGrad, false, "B0.1"})}),
                                one_p2p_stream({kernel({kGrad, true, "B0.1"}), kernel({kAct, false, "F0.2"})})};
  DeadlockResult res = find_deadlock(r);
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("deadlock"), std::string::npos) << res.message;
  EXPECT_NE(
      res.message.find("rank 0 p2p: kernel [send activation of stage 0 microbatch 2 for stage 1 to rank 1 (F0.2)]"),
      std::string::npos)
      << res.message;
  EXPECT_NE(res.message.find("rank 1 p2p: kernel [send"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("(B0.1)"), std::string::npos) << res.message;
}

// The same two ranks with each channel on its own stream: nothing waits.
TEST(Deadlock, CrossedSendsOnChannelStreamsRun) {
  auto rank = [](std::vector<StreamItem> act, std::vector<StreamItem> grad) {
    RankStreams r;
    r.streams = {{"compute", {}}, {"p2p activations 0->1", std::move(act)}, {"p2p gradients 1->0", std::move(grad)}};
    return r;
  };
  std::vector<RankStreams> r = {rank({kernel({kAct, true, "F0.2"})}, {kernel({kGrad, false, "B0.1"})}),
                                rank({kernel({kAct, false, "F0.2"})}, {kernel({kGrad, true, "B0.1"})})};
  DeadlockResult res = find_deadlock(r);
  EXPECT_TRUE(res.ok) << res.message;
}

TEST(Deadlock, AnUnmatchedSendIsReported) {
  std::vector<RankStreams> r = {one_p2p_stream({kernel({kAct, true, "F0.2"})}), one_p2p_stream({})};
  DeadlockResult res = find_deadlock(r);
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("no matching operation"), std::string::npos) << res.message;
}

// A compute stream that waits for a receive nobody sends: the cycle names the wait.
TEST(Deadlock, ComputeWaitingForAStuckReceiveIsNamed) {
  RankStreams r0 = one_p2p_stream({kernel({kGrad, false, "B0.1"})});
  r0.streams[0].items.push_back({StreamItem::Kind::Wait, 1, 1, {}, {}});
  r0.streams[0].items.push_back({StreamItem::Kind::Compute, 0, 0, {}, "B0.1"});
  RankStreams r1 = one_p2p_stream({});
  r1.streams[1].items.push_back({StreamItem::Kind::Wait, 0, 1, {}, {}});  // waits for its own compute
  r1.streams[1].items.push_back(kernel({kGrad, true, "B0.1"}));
  r1.streams[0].items.push_back({StreamItem::Kind::Wait, 1, 2, {}, {}});  // which waits for the send
  r1.streams[0].items.push_back({StreamItem::Kind::Compute, 0, 0, {}, "B0.1"});
  DeadlockResult res = find_deadlock({r0, r1});
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("rank 1 compute: compute B0.1 waits for rank 1 p2p"), std::string::npos) << res.message;
}

// The posting rules: receives are issued at once and compute waits for each receiving channel
// once; each sending channel waits for compute once, before its sends are issued.
TEST(Deadlock, PostingWaitsOncePerChannel) {
  struct Log final : P2pSink {
    std::vector<std::string> calls;
    void p2p_waits_for_compute(const P2pChannel& c) override { calls.push_back(to_string(c) + " waits"); }
    void compute_waits_for_p2p(const P2pChannel& c) override { calls.push_back("compute waits " + to_string(c)); }
  } log;
  const Message act2{Pass::F, 0, 1, 3, 0, 1};
  post_sends(log, {{kAct, true, [&] { log.calls.push_back("send act 2"); }},
                   {act2, true, [&] { log.calls.push_back("send act 3"); }}});
  EXPECT_EQ(log.calls, (std::vector<std::string>{"activations 0->1 waits", "send act 2", "send act 3"}));
  log.calls.clear();
  post_receives(log, {{kGrad, false, [&] { log.calls.push_back("recv grad"); }}});
  EXPECT_EQ(log.calls, (std::vector<std::string>{"recv grad", "compute waits gradients 1->0"}));
  log.calls.clear();
  post_receives(log, {});
  post_sends(log, {});
  EXPECT_TRUE(log.calls.empty());
}

// Channels: one per direction and message kind; the V's second chunk and the interleaved
// schedule's wrap-around add channels in the other direction.
TEST(Deadlock, ChannelsOfSchedules) {
  auto names = [](const std::vector<P2pChannel>& cs) {
    std::vector<std::string> out;
    for (const P2pChannel& c : cs) out.push_back(to_string(c));
    return out;
  };
  EXPECT_EQ(names(p2p_channels(generate("1f1b", 3, 6))),
            (std::vector<std::string>{"activations 0->1", "gradients 1->0", "activations 1->2", "gradients 2->1"}));
  EXPECT_EQ(names(p2p_channels(generate("1f1b", 3, 6), 2)),
            (std::vector<std::string>{"activations 1->2", "gradients 2->1"}));
  EXPECT_EQ(names(p2p_channels(generate("zb-v", 2, 4))),
            (std::vector<std::string>{"activations 0->1", "gradients 0->1", "activations 1->0", "gradients 1->0"}));
  EXPECT_EQ(p2p_channels(generate("1f1b-i", 3, 6)).size(), 6u);  // 0->1, 1->2, 2->0, both kinds
  EXPECT_TRUE(p2p_channels(generate("1f1b", 1, 2)).empty());
}

namespace {

DeadlockResult check(const std::string& name, int pp, int m, P2pStreams streams) {
  DeadlockOptions o;
  o.streams = streams;
  return find_deadlock(generate(name, pp, m), o);
}

}  // namespace

// Every schedule, pp in {2, 3, 4, 6, 8}, m from the minimum up to 3p + 4, with the executor's
// posting. tp does not enter: TP all-reduces run on their own stream and communicator and the ranks
// of a TP group post the same p2p operations, each pipeline (dp, tp) on its own channels.
TEST(Deadlock, EveryScheduleIsFreeOnChannelStreams) {
  int checked = 0;
  for (const char* name : {"gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-v", "stp"})
    for (int pp : {2, 3, 4, 6, 8})
      for (int m = min_microbatches(name, pp); m <= 3 * pp + 4; ++m) {
        DeadlockResult r = check(name, pp, m, P2pStreams::PerChannel);
        EXPECT_TRUE(r.ok) << name << " pp " << pp << " m " << m << ": " << r.message;
        ++checked;
      }
  EXPECT_EQ(checked, 493);
}

// With every channel on one p2p stream per rank (the former single stream, without groups), two
// neighbours each send to the other before posting the matching receive: the check names the ops.
TEST(Deadlock, OneSharedP2pStreamHasCrossedSends) {
  struct Case {
    const char* name;
    int pp, m;
  };
  for (const Case& c :
       {Case{"1f1b", 2, 4}, Case{"zb-h1", 4, 8}, Case{"1f1b-i", 2, 4}, Case{"zb-v", 2, 3}, Case{"stp", 6, 17}}) {
    DeadlockResult r = check(c.name, c.pp, c.m, P2pStreams::Shared);
    ASSERT_FALSE(r.ok) << c.name;
    EXPECT_NE(r.message.find("deadlock: a cycle of waits"), std::string::npos) << c.name << ": " << r.message;
    EXPECT_NE(r.message.find(" p2p: kernel [send"), std::string::npos) << c.name << ": " << r.message;
    EXPECT_TRUE(check(c.name, c.pp, c.m, P2pStreams::PerChannel).ok) << c.name;
  }
}

// If connecting a channel at its first transfer makes both hosts wait for each other, the ranks
// must first use their shared channels in the same order: they do, for every schedule swept.
TEST(Deadlock, FirstUsesOfChannelsAgree) {
  for (const char* name : {"gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-v", "stp"})
    for (int pp : {2, 3, 4, 6, 8})
      for (int m = min_microbatches(name, pp); m <= 3 * pp + 4; ++m) {
        DeadlockResult r = find_connect_deadlock(generate(name, pp, m));
        EXPECT_TRUE(r.ok) << name << " pp " << pp << " m " << m << ": " << r.message;
      }
  // Planted: rank 0 first receives a gradient, rank 1 first receives an activation.
  Schedule s = generate("1f1b", 2, 2);
  std::rotate(s.ranks[0].begin(), s.ranks[0].begin() + 2, s.ranks[0].end());  // B0.1 first
  DeadlockResult r = find_connect_deadlock(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 0 waits to connect gradients 1->0 (B0.1)"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("rank 1 waits to connect activations 0->1 (F0.1)"), std::string::npos) << r.message;
}
