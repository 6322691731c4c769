// The pipeline deadlock check (schedule/deadlock.h): it finds a planted crossed-send ordering, names
// the ops of the cycle, and passes for every schedule, (pp, m) and layout the executor produces.
#include <gtest/gtest.h>

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

// The executor's streams of 1F1B, with one rank's group kernels put in the order that rank
// joined the lanes before the fixed lane order (its sends' lane first): the check must fail.
TEST(Deadlock, PerRankJoinOrderOfTheExecutorDeadlocks) {
  Schedule s = generate("1f1b", 2, 4);
  DeadlockOptions o;
  o.rule = GroupRule::JoinOrder;
  std::vector<RankStreams> r = record_streams(s, o);
  ASSERT_TRUE(find_deadlock(r).ok);
  bool swapped = false;
  auto& p2p = r[1].p2p;
  for (std::size_t i = 0; i + 1 < p2p.size(); ++i)
    if (p2p[i].kind == StreamItem::Kind::Kernel && p2p[i + 1].kind == StreamItem::Kind::Kernel &&
        p2p[i + 1].ops.front().send && !p2p[i].ops.front().send) {
      std::swap(p2p[i], p2p[i + 1]);
      swapped = true;
      break;
    }
  ASSERT_TRUE(swapped) << "no two-lane group on rank 1";
  DeadlockResult res = find_deadlock(r);
  ASSERT_FALSE(res.ok);
  EXPECT_NE(res.message.find("rank 0 p2p"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("rank 1 p2p"), std::string::npos) << res.message;
}

// A group issues its operations lane by lane, whatever order they were posted in.
TEST(Deadlock, GroupsIssueTheActivationLaneFirst) {
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
  g.receives({{kAct, false, [&] { log.calls.push_back("recv act"); }}});
  EXPECT_FALSE(g.open());
  EXPECT_EQ(log.calls,
            (std::vector<std::string>{"p2p waits", "begin", "recv act", "send grad", "end", "compute waits"}));
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

// One-chunk schedules exchange each message kind in one direction per channel: no cycle.
TEST(Deadlock, OneChunkSchedulesAreFreeUnderBothRules) {
  int checked = 0;
  for (const char* name : {"gpipe", "1f1b", "zb-h1"})
    for (int pp : {2, 3, 4, 6, 8})
      for (int m = min_microbatches(name, pp); m <= 2 * pp + 4; ++m)
        for (GroupRule rule : {GroupRule::Together, GroupRule::JoinOrder}) {
          std::string why;
          EXPECT_TRUE(free_of_deadlock(name, pp, m, rule, &why)) << name << " pp " << pp << " m " << m << ": " << why;
          ++checked;
        }
  EXPECT_EQ(checked, 2 * 3 * (8 + 10 + 12 + 16 + 20));
}

// STP at pp <= 4 is free when a group's operations progress together (NCCL >= 2.26, which stp
// requires), and not with per-communicator kernels in join order (older NCCL).
TEST(Deadlock, StpUpToFourStagesNeedsGroupsThatProgressTogether) {
  for (int pp : {2, 3, 4})
    for (int m = 2 * pp; m <= 4 * pp + 4; ++m) {
      std::string why;
      EXPECT_TRUE(free_of_deadlock("stp", pp, m, GroupRule::Together, &why))
          << "pp " << pp << " m " << m << ": " << why;
    }
  std::string why;
  EXPECT_FALSE(free_of_deadlock("stp", 2, 4, GroupRule::JoinOrder, &why));
  EXPECT_NE(why.find("deadlock"), std::string::npos);
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
