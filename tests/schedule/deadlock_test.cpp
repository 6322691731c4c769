// The pipeline deadlock check (schedule/deadlock.h): it finds a planted crossed-send ordering, names
// the ops of the cycle, and passes for every schedule, (pp, m) and layout the executor produces.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "schedule/deadlock.h"
#include "schedule/p2p_groups.h"

using namespace stp::sched;

namespace {

StreamItem kernel(int lane, std::vector<P2pOp> ops) {
  StreamItem k;
  k.kind = StreamItem::Kind::Kernel;
  k.lane = lane;
  k.ops = std::move(ops);
  return k;
}

// Stage 0 on rank 0 sends the activation of microbatch 2 and receives the gradient of
// microbatch 1; rank 1 (the last stage) does the opposite.
const Message kAct{Pass::F, 0, 1, 2, 0, 1};
const Message kGrad{Pass::B, 1, 0, 1, 1, 0};

}  // namespace

TEST(Deadlock, MatchedJoinOrderRuns) {
  std::vector<RankStreams> r(2);
  r[0].p2p = {kernel(0, {{kAct, true, "F0.2"}}), kernel(1, {{kGrad, false, "B0.1"}})};
  r[1].p2p = {kernel(0, {{kAct, false, "F0.2"}}), kernel(1, {{kGrad, true, "B0.1"}})};
  DeadlockResult res = find_deadlock(r);
  EXPECT_TRUE(res.ok) << res.message;
}

TEST(Deadlock, CrossedSendsAreACycleNamingTheOps) {
  std::vector<RankStreams> r(2);
  r[0].p2p = {kernel(0, {{kAct, true, "F0.2"}}), kernel(1, {{kGrad, false, "B0.1"}})};
  r[1].p2p = {kernel(1, {{kGrad, true, "B0.1"}}), kernel(0, {{kAct, false, "F0.2"}})};  // joined the other way
  DeadlockResult res = find_deadlock(r);
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("deadlock"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("rank 0 p2p: group kernel on the activation lane [send activation of stage 0 microbatch 2 "
                             "for stage 1 to rank 1 (F0.2)]"),
            std::string::npos)
      << res.message;
  EXPECT_NE(res.message.find("rank 1 p2p: group kernel on the gradient lane [send"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("(F0.2)"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("(B0.1)"), std::string::npos) << res.message;
}

TEST(Deadlock, AnUnmatchedSendIsReported) {
  std::vector<RankStreams> r(2);
  r[0].p2p = {kernel(0, {{kAct, true, "F0.2"}})};
  DeadlockResult res = find_deadlock(r);
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("no matching operation"), std::string::npos) << res.message;
}

// The executor's own streams of 1F1B on two stages: the last stage's groups hold a gradient send
// then an activation receive, the first stage's the opposite, so with one kernel per communicator
// in join order (NCCL before 2.26) the two stages wait on each other's sends; when a group's
// operations progress together (2.26 and later) they do not.
TEST(Deadlock, PerRankJoinOrderDeadlocksBefore226) {
  Schedule s = generate("1f1b", 2, 4);
  DeadlockOptions o;
  o.rule = GroupRule::JoinOrder;
  DeadlockResult old = find_deadlock(s, o);
  ASSERT_FALSE(old.ok);
  EXPECT_NE(old.message.find("rank 0 p2p: group kernel on the activation lane [send"), std::string::npos)
      << old.message;
  EXPECT_NE(old.message.find("rank 1 p2p: group kernel on the gradient lane [send"), std::string::npos) << old.message;
  o.rule = GroupRule::Together;
  DeadlockResult now = find_deadlock(s, o);
  EXPECT_TRUE(now.ok) << now.message;
}

// A group issues its operations in posting order: the sends of op k before the receives of op
// k+1, so on an in-order stream (the CPU backend) a send never waits behind a receive.
TEST(Deadlock, GroupsIssueSendsBeforeReceives) {
  struct Log final : P2pSink {
    std::vector<std::string> calls;
    void group_begin() override { calls.push_back("begin"); }
    void group_end() override { calls.push_back("end"); }
    void p2p_waits_for_compute() override { calls.push_back("p2p waits"); }
    void compute_waits_for_p2p() override { calls.push_back("compute waits"); }
  } log;
  P2pGrouping g(log);
  g.sends({{kGrad, true, [&] { log.calls.push_back("send grad"); }}});
  EXPECT_TRUE(g.open());
  EXPECT_EQ(log.calls, (std::vector<std::string>{"p2p waits", "begin"}));  // kept while open
  g.receives({{kAct, false, [&] { log.calls.push_back("recv act"); }}});
  EXPECT_FALSE(g.open());
  EXPECT_EQ(log.calls,
            (std::vector<std::string>{"p2p waits", "begin", "send grad", "recv act", "end", "compute waits"}));
  g.sends({{kAct, true, [&] { log.calls.push_back("send act"); }}});
  g.before_collective();  // tp > 1: closed before an all-reduce
  EXPECT_FALSE(g.open());
  g.finish();
  EXPECT_EQ(log.calls.back(), "end");
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), std::string("end")), 2);
}

// A sink whose communicators enqueue at the call (the CPU backend) gets each operation at once.
TEST(Deadlock, NonDeferringSinksIssueAtTheCall) {
  struct Log final : P2pSink {
    std::vector<std::string> calls;
    void group_begin() override { calls.push_back("begin"); }
    void group_end() override { calls.push_back("end"); }
    void p2p_waits_for_compute() override { calls.push_back("p2p waits"); }
    void compute_waits_for_p2p() override { calls.push_back("compute waits"); }
    bool defers() const override { return false; }
  } log;
  P2pGrouping g(log);
  g.sends({{kGrad, true, [&] { log.calls.push_back("send grad"); }}});
  EXPECT_EQ(log.calls, (std::vector<std::string>{"p2p waits", "begin", "send grad"}));
  g.receives({{kAct, false, [&] { log.calls.push_back("recv act"); }}});
  EXPECT_EQ(log.calls,
            (std::vector<std::string>{"p2p waits", "begin", "send grad", "recv act", "end", "compute waits"}));
}

// Over every schedule, pp in {2, 3, 4, 6, 8}, m from the minimum up, tp = 1 and tp > 1,
// under both NCCL group rules: how the executor's current grouping fares.
namespace {

bool free_of_deadlock(const std::string& name, int pp, int m, GroupRule rule, std::string* why) {
  for (bool tp : {false, true}) {
    DeadlockOptions o;
    o.tp_collectives = tp;
    o.rule = rule;
    DeadlockResult r = find_deadlock(generate(name, pp, m), o);
    if (!r.ok) {
      *why = r.message;
      return false;
    }
  }
  return true;
}

}  // namespace

// One-chunk schedules send activations down and gradients up, each receive posted by the op
// after the send it waits for: free when a group's operations progress together.
TEST(Deadlock, OneChunkSchedulesAreFreeWhenGroupsProgressTogether) {
  int checked = 0;
  for (const char* name : {"gpipe", "1f1b", "zb-h1"})
    for (int pp : {2, 3, 4, 6, 8})
      for (int m = min_microbatches(name, pp); m <= 2 * pp + 4; ++m) {
        std::string why;
        EXPECT_TRUE(free_of_deadlock(name, pp, m, GroupRule::Together, &why))
            << name << " pp " << pp << " m " << m << ": " << why;
        ++checked;
      }
  EXPECT_EQ(checked, 3 * (8 + 10 + 12 + 16 + 20));
}

// With one kernel per communicator in each rank's join order (NCCL before 2.26), every schedule
// that has a rank send a gradient and receive an activation in one group deadlocks: why stp
// refuses older NCCL. GPipe (all forwards, then all backwards) is the exception.
TEST(Deadlock, JoinOrderDeadlocksAlmostEverySchedule) {
  std::string why;
  for (int pp : {2, 4, 8}) {
    EXPECT_TRUE(free_of_deadlock("gpipe", pp, 2 * pp, GroupRule::JoinOrder, &why)) << why;
    for (const char* name : {"1f1b", "zb-h1", "1f1b-i", "zb-v"})
      EXPECT_FALSE(free_of_deadlock(name, pp, 2 * pp, GroupRule::JoinOrder, &why)) << name << " pp " << pp;
  }
  EXPECT_FALSE(free_of_deadlock("stp", 3, 6, GroupRule::JoinOrder, &why));
}

// STP at pp <= 4 is free when a group's operations progress together (NCCL >= 2.26, which stp
// requires).
TEST(Deadlock, StpUpToFourStagesIsFreeWhenGroupsProgressTogether) {
  for (int pp : {2, 3, 4})
    for (int m = 2 * pp; m <= 4 * pp + 4; ++m) {
      std::string why;
      EXPECT_TRUE(free_of_deadlock("stp", pp, m, GroupRule::Together, &why))
          << "pp " << pp << " m " << m << ": " << why;
    }
}

// Open (docs/gpu-readiness.md section 8, crossed sends): with a single p2p stream, two neighbours that each send to the
// other before receiving wait for ever once messages outgrow NCCL's buffers. The two-chunk
// schedules do this; the check names the ops. When the executor changes, these cases flip.
TEST(Deadlock, TwoChunkSchedulesHaveCrossedSendsToday) {
  struct Case {
    const char* name;
    int pp, m;
    const char* op;  // an op named in the cycle
  };
  for (const Case& c : {Case{"1f1b-i", 2, 4, "(B1.1)"}, Case{"zb-v", 2, 3, "(F0.3)"}, Case{"stp", 6, 12, "(F1.5)"}}) {
    std::string why;
    EXPECT_FALSE(free_of_deadlock(c.name, c.pp, c.m, GroupRule::Together, &why)) << c.name;
    EXPECT_NE(why.find(c.op), std::string::npos) << c.name << ": " << why;
  }
  std::string why;
  EXPECT_TRUE(free_of_deadlock("1f1b-i", 2, 3, GroupRule::Together, &why)) << why;
  EXPECT_TRUE(free_of_deadlock("zb-v", 2, 2, GroupRule::Together, &why)) << why;
}
