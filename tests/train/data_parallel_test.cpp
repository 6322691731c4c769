// Data parallelism in one process (dp replicas as threads, HostComm): the same code path as a
// multi-process job except for the communicator (tests/tools/ runs the same checks under mpirun).
//
//   * dp replicas × m microbatches reproduce one replica running dp·m microbatches (the same
//     global batch: replica d reads global microbatches d·m .. d·m + m − 1): losses to 1e-5
//     relative — the first step bitwise when tp = 1 (the forward is the same math and the step
//     loss the same sum in the same order) — and parameters to 1e-5 normwise after three steps;
//   * every replica holds bitwise the same parameters after every step (identical optimizer step);
//   * bucket size does not change a single bit (buckets only cut the same element-wise sums);
//   * with two chunks per rank the later chunk's DP all-reduce starts while the earlier chunk's
//     backward is still running (overlap), never before its own gradients are final;
//   * a dp = 2 checkpoint resumes at dp = 1 with the identical next loss;
//   * STP_FAULT_RANK makes the step fail quickly with the failing rank's message.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/trace.h"
#include "schedule/schedule.h"
#include "tests/train/train_fixture.h"
#include "train/rank_layout.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

struct TrainRun {
  std::vector<double> losses;
  std::map<std::string, stp::HostTensor> params;
  bool replicas_identical = true;
};

TrainRun train(const std::vector<std::string>& overrides, int dp) {
  stp::Trainer t(tiny_config(overrides));
  TrainRun out;
  for (int i = 0; i < 3; ++i) {
    out.losses.push_back(t.step().loss);
    auto first = t.full_parameters(0);
    for (int d = 1; d < dp; ++d)
      out.replicas_identical = out.replicas_identical && stp::testing::bitwise_equal(t.full_parameters(d), first);
  }
  out.params = t.full_parameters();
  return out;
}

const TrainRun& reference() {  // one replica, the whole global batch of 8 microbatches
  static const TrainRun r = train({}, 1);
  return r;
}

struct Layout {
  int dp, pp, tp;
  const char* schedule;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << "dp " << l.dp << " pp " << l.pp << " tp " << l.tp << " " << l.schedule;
}

std::vector<std::string> overrides(const Layout& l) {
  return {"parallel.dp=" + std::to_string(l.dp), "parallel.pp=" + std::to_string(l.pp),
          "parallel.tp=" + std::to_string(l.tp), std::string("parallel.schedule=") + l.schedule,
          "train.microbatches=" + std::to_string(8 / l.dp)};
}

class DataParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallel, MatchesOneReplicaOnTheSameGlobalBatch) {
  const Layout l = GetParam();
  TrainRun run = train(overrides(l), l.dp);
  const TrainRun& ref = reference();
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
  if (l.tp == 1) {
    EXPECT_EQ(run.losses[0], ref.losses[0]) << "the first step's forward is the same math";
  }
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(run.params, ref.params, &where), 1e-5) << "worst at " << where;
  EXPECT_LT(stp::testing::key_bias_max_abs_diff(run.params, ref.params), 1e-3 * 3 * 1e-3);
  EXPECT_TRUE(run.replicas_identical) << "replicas diverged: the optimizer step differs between replicas";
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallel,
                         ::testing::Values(Layout{4, 1, 1, "gpipe"}, Layout{2, 2, 1, "1f1b"}, Layout{2, 1, 2, "gpipe"},
                                           Layout{2, 2, 2, "stp"}, Layout{2, 2, 1, "zb-v"}, Layout{2, 2, 1, "1f1b-i"},
                                           Layout{4, 2, 1, "gpipe"}),
                         stp::testing::layout_case_name<Layout>);

TEST(DataParallel, BucketSizeChangesNoBit) {
  const std::vector<std::string> base = {"parallel.dp=2", "parallel.pp=2", "parallel.schedule=stp",
                                         "train.microbatches=4"};
  auto with = [&](const std::string& bucket) {
    auto o = base;
    o.push_back("parallel.dp_bucket=" + bucket);
    return train(o, 2);
  };
  TrainRun whole = with("null"), small = with("256");  // 64 gradients per all-reduce: hundreds of buckets
  EXPECT_EQ(small.losses, whole.losses);
  EXPECT_TRUE(stp::testing::bitwise_equal(small.params, whole.params));
  EXPECT_TRUE(small.replicas_identical && whole.replicas_identical);
}

// With two chunks per rank, one chunk's gradients are final ops before the other's (1f1b-i: chunk 1,
// whose last backward comes first; zb-v: chunk 0, chunk 1's W being deferred to the end). That
// chunk's buckets must be reduced while the remaining backward still runs on compute — starting
// after its own last backward op, and before the step's last op has finished. The TP link is
// emulated slow (each TP all-reduce ~16 ms) so the remaining backward lasts far longer than thread
// scheduling jitter on a loaded machine: the check is about stream ordering, not timing luck.
TEST(DataParallel, FirstFinishedChunkIsReducedDuringTheRemainingBackward) {
  for (const char* name : {"1f1b-i", "zb-v"}) {
    SCOPED_TRACE(name);
    stp::Trainer t(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.tp=2",
                                std::string("parallel.schedule=") + name, "train.microbatches=4",
                                "parallel.dp_bucket=null", "output.trace=true", "parallel.tp_link_bandwidth=1MB/s"}));
    t.step();
    const stp::sched::Schedule sched = stp::sched::generate(name, 2, 4);
    int checked = 0;
    for (int g = 0; g < t.world_size(); ++g) {
      const auto& ops = sched.ranks[static_cast<std::size_t>(g / 2 % 2)];
      std::size_t last_backward[2] = {0, 0};
      for (std::size_t k = 0; k < ops.size(); ++k)
        for (int i = 0; i < ops[k].n_parts(); ++i)
          if (ops[k].part(i).pass != stp::sched::Pass::F) last_backward[ops[k].part(i).chunk] = k;
      const int early = last_backward[0] < last_backward[1] ? 0 : 1;
      ASSERT_LT(last_backward[early] + 1, ops.size()) << "rank " << g << ": nothing left to overlap with";
      std::vector<std::pair<double, double>> op_spans;  // (begin, end) in op order
      double ar_begin = -1;
      for (const auto& s : t.trace()->spans()) {
        if (s.pid != g) continue;
        if (s.tid == "compute" && s.category == "op") op_spans.emplace_back(s.ts_us, s.ts_us + s.dur_us);
        if (s.tid == "dp-comm" && s.name == "AR dp chunk " + std::to_string(early) + " bucket 0") ar_begin = s.ts_us;
      }
      std::sort(op_spans.begin(), op_spans.end());
      ASSERT_EQ(op_spans.size(), ops.size());
      ASSERT_GE(ar_begin, 0) << "rank " << g << " traced no DP all-reduce of chunk " << early;
      EXPECT_GE(ar_begin, op_spans[last_backward[early]].second)
          << "rank " << g << ": chunk " << early << " reduced before its gradients were final";
      // Only a tail with a B op (whose TP all-reduces are exposed, ~16 ms each) is long enough to
      // assert on; a tail of W ops alone (zb-v) is tens of microseconds.
      bool tail_has_b = false;
      for (std::size_t k = last_backward[early] + 1; k < ops.size(); ++k)
        for (int i = 0; i < ops[k].n_parts(); ++i)
          tail_has_b = tail_has_b || ops[k].part(i).pass == stp::sched::Pass::B;
      if (!tail_has_b) continue;
      ++checked;
      EXPECT_LT(ar_begin, op_spans.back().second)
          << "rank " << g << ": chunk " << early << "'s reduction waited for the whole backward (last op "
          << op_spans.back().first << ".." << op_spans.back().second << " us)";
    }
    if (std::string(name) == "1f1b-i") {
      EXPECT_EQ(checked, 8) << "every rank of 1f1b-i has a backward tail";
    }
  }
}

TEST(DataParallel, CheckpointOfDp2ResumesAtDp1WithIdenticalLoss) {
  auto dir = std::filesystem::path(STP_BINARY_DIR) / "tests" / "dp_resume";
  std::filesystem::remove_all(dir);
  std::string ckpt;
  double next_loss = 0;
  std::map<std::string, stp::HostTensor> next_params;
  {
    auto cfg = tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.schedule=1f1b", "train.microbatches=4"});
    cfg.output.dir = dir.string();
    stp::Trainer t(cfg);
    t.step();
    t.step();
    ckpt = t.save_checkpoint();
    next_loss = t.step().loss;
    next_params = t.full_parameters();
  }
  auto cfg = tiny_config({"parallel.dp=1", "train.microbatches=8"});
  cfg.train.resume = ckpt;
  stp::Trainer t(cfg);
  EXPECT_EQ(t.steps_done(), 2);
  EXPECT_EQ(t.step().loss, next_loss) << "same parameters, same global batch, same forward";
  EXPECT_LT(stp::testing::max_rel_diff(t.full_parameters(), next_params), 1e-5);
}

TEST(DataParallel, FailingRankStopsTheStepWithItsMessage) {
  ::setenv("STP_FAULT_RANK", "3", 1);
  ::setenv("STP_FAULT_STEP", "2", 1);
  stp::Trainer t(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.schedule=1f1b", "train.microbatches=4"}));
  ::unsetenv("STP_FAULT_RANK");
  ::unsetenv("STP_FAULT_STEP");
  t.step();
  auto start = std::chrono::steady_clock::now();
  try {
    t.step();
    FAIL() << "the injected failure did not stop the step";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure of rank 3 in step 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(RankLayout, TpInnermostThenPpThenDp) {
  stp::RankLayout l{2, 3, 2};
  EXPECT_EQ(l.size(), 12);
  for (int d = 0; d < 2; ++d)
    for (int p = 0; p < 3; ++p)
      for (int t = 0; t < 2; ++t) {
        int g = l.global(d, p, t);
        EXPECT_EQ(g, (d * 3 + p) * 2 + t);
        EXPECT_EQ(l.dp_rank(g), d);
        EXPECT_EQ(l.pp_rank(g), p);
        EXPECT_EQ(l.tp_rank(g), t);
      }
  EXPECT_EQ(l.ranks_of_process(0, 1).size(), 12u);
  EXPECT_EQ(l.ranks_of_process(5, 12), std::vector<int>{5});
}

TEST(RankLayout, ProcessCountMustEqualRanks) {
  stp::RankLayout l{2, 1, 1};
  EXPECT_NO_THROW(stp::check_processes(l, 1));
  EXPECT_NO_THROW(stp::check_processes(l, 2));
  try {
    stp::check_processes(l, 4);
    FAIL() << "2 ranks on 4 processes accepted";
  } catch (const stp::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("2 x 1 x 1 = 2 ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("started 4 processes"), std::string::npos) << what;
  }
}

}  // namespace
