// The validator rejects hand-broken schedules with a message naming the op, and accepts every generated one
// over a sweep of p, m and random costs (which also must simulate without deadlock).
#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"

using namespace stp::sched;

namespace {

// The validator's message for s, or "" if it passes.
std::string error_of(const Schedule& s, ChannelModel model = ChannelModel::Lanes) {
  try {
    validate(s, model);
  } catch (const stp::Error& e) {
    return e.what();
  }
  return "";
}

int find_op(const std::vector<Op>& ops, const char* text) {
  for (int i = 0; i < static_cast<int>(ops.size()); ++i)
    if (to_string(ops[i]) == text) return i;
  return -1;
}

}  // namespace

TEST(Validator, RejectsMissingW) {
  Schedule s = generate("stp", 4, 12);
  auto& ops = s.ranks[0];
  ops.erase(ops.begin() + find_op(ops, "W1.6"));
  EXPECT_EQ(error_of(s), "rank 0 op 19 'F1.7&B1.6*' defers its W but no W or F&W on rank 0 consumes it");
}

TEST(Validator, RejectsWBeforeItsB) {
  Schedule s = generate("zb-h1", 2, 4);
  auto& ops = s.ranks[1];  // rank 1 keeps one W pending: F0.1 B0.1* F0.2 B0.2* W0.1 ...
  int w = find_op(ops, "W0.1"), b = find_op(ops, "B0.1*");
  std::swap(ops[w], ops[b]);
  EXPECT_NE(error_of(s).find("'W0.1': W of stage 1 microbatch 1 runs before its B"), std::string::npos) << error_of(s);
}

TEST(Validator, RejectsWOfFusedBackward) {
  Schedule s = generate("1f1b", 2, 2);
  s.ranks[0].push_back(Op::w(0, 1));
  EXPECT_EQ(error_of(s), "rank 0 op 4 'W0.1': 'B0.1' at op 2 did not defer its W");
}

TEST(Validator, RejectsSwappedChannelOrder) {
  Schedule s = generate("stp", 4, 12);
  auto& ops = s.ranks[0];
  std::swap(ops[find_op(ops, "F0.2")], ops[find_op(ops, "F0.3")]);
  EXPECT_EQ(error_of(s),
            "channel rank 0 -> rank 1 (activations) disagrees at message 1: rank 0 op 1 'F0.3' sends the activation "
            "of stage 0 microbatch 3 for stage 1 but rank 1 op 1 'F0.2' expects the activation of stage 0 microbatch "
            "2 for stage 1");
}

TEST(Validator, RejectsStageOnTwoRanks) {
  Schedule s = generate("1f1b-i", 4, 8);
  s.stage_of[1][0] = 0;
  EXPECT_EQ(error_of(s), "stage 0 is on two ranks: rank 0 chunk 0 and rank 1 chunk 0");
}

TEST(Validator, RejectsCycle) {
  // rank 0: F0.1 B0.1 F0.2 B0.2 and rank 1: F0.1 F0.2 B0.1 B0.2 — counts and channels fine, but rank 0's
  // B0.1 waits for rank 1's B0.1, which runs after rank 1's F0.2, which waits for rank 0's F0.2.
  Schedule s = make_schedule("broken", 2, 2, 1, Placement::Interleaved);
  s.ranks[0] = parse_ops("F0.1 B0.1 F0.2 B0.2");
  s.ranks[1] = parse_ops("F0.1 F0.2 B0.1 B0.2");
  EXPECT_EQ(error_of(s),
            "schedule 'broken' deadlocks: rank 0 op 1 'B0.1' waits for B of stage 1 microbatch 1 (rank 1); "
            "rank 1 op 1 'F0.2' waits for F of stage 0 microbatch 2 (rank 0)");
}

TEST(Validator, RejectsMissingAndRepeatedForward) {
  Schedule s = generate("gpipe", 2, 3);
  s.ranks[1][2] = Op::f(0, 2);
  EXPECT_EQ(error_of(s), "rank 1 op 2 'F0.2' repeats F0.2 (stage 1), first at op 1");
  s.ranks[1].erase(s.ranks[1].begin() + 2);
  EXPECT_EQ(error_of(s), "rank 1 op 4 'B0.3': backward of stage 1 microbatch 3 runs before its forward");
  s.ranks[1].pop_back();
  EXPECT_EQ(error_of(s), "stage 1 (rank 1 chunk 0) has no forward of microbatch 3 (each stage needs exactly 3)");
}

TEST(Validator, RejectsOutOfRangeMicrobatch) {
  Schedule s = generate("stp", 2, 4);
  s.ranks[0][0] = Op::f(0, 5);
  EXPECT_EQ(error_of(s), "rank 0 op 0 'F0.5': microbatch 5 out of range 1..4");
}

TEST(Validator, ZbvNeedsChannelLanes) {
  // Note [Channel lanes]: the other schedules also agree on one shared FIFO per rank pair (the sweep below
  // checks exactly which (schedule, p, m) need lanes).
  EXPECT_NE(error_of(generate("zb-v", 4, 8), ChannelModel::SharedFifo)
                .find("rank 1 op 8 'B1.1*' expects the "
                      "gradient"),
            std::string::npos);
  for (const char* name : {"gpipe", "1f1b", "1f1b-i", "zb-h1", "stp"})
    EXPECT_EQ(error_of(generate(name, 4, 16), ChannelModel::SharedFifo), "") << name;
}

TEST(Validator, GeneratorsRejectTooFewMicrobatches) {
  try {
    generate("stp", 4, 7);
    FAIL() << "no error";
  } catch (const stp::Error& e) {
    EXPECT_STREQ(e.what(), "schedule 'stp' needs at least 8 microbatches for pp 4 (2p), got 7");
  }
  EXPECT_THROW(generate("gpipe", 4, 0), stp::Error);
  EXPECT_THROW(generate("1f1b", 0, 4), stp::Error);
  EXPECT_THROW(generate("nope", 4, 8), stp::Error);
}

// Sweep: p ∈ {2, 3, 4, 8}, m ∈ {1 … 4p} where supported, random costs: every schedule validates (also with
// a shared FIFO where Note [Channel lanes] says so) and simulates; busy time is the sum of the op work.
TEST(Sweep, EveryScheduleValidatesAndSimulates) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> cost(0.1, 2.0), comm(0.0, 1.0);
  int checked = 0;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 4 * p; ++m) {
      for (const std::string& name : schedule_names()) {
        if (m < min_microbatches(name, p)) {
          EXPECT_THROW(generate(name, p, m), stp::Error) << name << " p=" << p << " m=" << m;
          continue;
        }
        Schedule s = generate(name, p, m);
        ASSERT_EQ(error_of(s), "") << name << " p=" << p << " m=" << m;
        bool may_need_lanes = name == "zb-v" || (name == "1f1b-i" && p == 2 && m % 2 == 1);
        EXPECT_TRUE(may_need_lanes || error_of(s, ChannelModel::SharedFifo).empty())
            << name << " p=" << p << " m=" << m << ": " << error_of(s, ChannelModel::SharedFifo);
        Costs c;
        c.tf = cost(rng), c.tb = cost(rng), c.tw = cost(rng), c.tar = comm(rng), c.tp2p = comm(rng);
        SimResult r = simulate(s, c);
        double per_rank = m * s.chunks * (c.tf + c.tb + c.tw);
        for (const RankStats& rs : r.ranks) {
          EXPECT_NEAR(rs.busy, per_rank, 1e-9) << name << " p=" << p << " m=" << m;
          EXPECT_GE(rs.pp_bubble, -1e-9) << name;
          EXPECT_GE(rs.tp_exposed, -1e-9) << name;
          EXPECT_LE(rs.end, r.makespan);
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}
