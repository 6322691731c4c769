// Bytes each rank sends per step, by kind (TP, PP, DP, other), equal the analytic formula of
// train/comm_volume.h exactly, in every step, for layouts covering every term: TP, interleaved and
// V placements (the V's local turn sends nothing), tied-embedding sums, DP with small buckets, and
// the distributed optimizer's reduce-scatters and all-gathers. The Llama cases take the
// architecture's own counts (a separate or tied head, biases on q, k and v, grouped k/v heads, an
// RMSNorm's gradient partials under vocab parallelism).
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/comm_volume.h"
#include "train/trainer.h"

namespace {

struct Case {
  int dp, pp, tp;
  const char* schedule;
  int microbatches;
  bool distributed = false;  // parallel.distributed_optimizer
  bool bf16 = false;         // train.precision (with it: sharded masters, bf16 all-gathers)
};

void PrintTo(const Case& l, std::ostream* os) {
  *os << "dp " << l.dp << " pp " << l.pp << " tp " << l.tp << " " << l.schedule
      << (l.distributed ? " distributed optimizer" : "") << (l.bf16 ? " bf16" : "");
}

// Two steps of the case's layout on tiny_config with `model` (its model.* overrides): the bytes
// every rank sent in each step equal expected_comm_bytes.
void expect_formula(const Case& c, const std::vector<std::string>& model = {}) {
  std::vector<std::string> overrides = {
      "parallel.dp=" + std::to_string(c.dp),
      "parallel.pp=" + std::to_string(c.pp),
      "parallel.tp=" + std::to_string(c.tp),
      std::string("parallel.schedule=") + c.schedule,
      "train.microbatches=" + std::to_string(c.microbatches),
      "parallel.dp_bucket=1KiB",
      std::string("parallel.distributed_optimizer=") + (c.distributed ? "true" : "false"),
      std::string("train.precision=") + (c.bf16 ? "bf16" : "f32")};
  overrides.insert(overrides.end(), model.begin(), model.end());
  auto cfg = stp::testing::tiny_config(overrides);
  stp::Trainer t(cfg);
  std::vector<stp::CommBytes> before(static_cast<std::size_t>(t.world_size()));
  for (int step = 1; step <= 2; ++step) {
    t.step();
    auto after = t.comm_bytes();
    ASSERT_EQ(after.size(), before.size());
    for (std::size_t i = 0; i < after.size(); ++i) {
      const stp::CommBytes& a = after[i];
      stp::CommVolume f = stp::expected_comm_bytes(cfg, a.global);
      SCOPED_TRACE("rank " + std::to_string(a.global) + " step " + std::to_string(step));
      EXPECT_EQ(a.tp - before[i].tp, f.tp);
      EXPECT_EQ(a.pp - before[i].pp, f.pp);
      EXPECT_EQ(a.dp - before[i].dp, f.dp);
      EXPECT_EQ(a.other - before[i].other, f.other);
    }
    before = after;
  }
  // The formula is not trivially satisfied: every configured kind moved bytes.
  const stp::CommVolume f0 = stp::expected_comm_bytes(cfg, 0);
  EXPECT_EQ(f0.tp > 0, c.tp > 1);
  EXPECT_EQ(f0.pp > 0, c.pp > 1);
  EXPECT_EQ(f0.dp > 0, c.dp > 1);
}

class CommVolume : public ::testing::TestWithParam<Case> {};

TEST_P(CommVolume, MeasuredBytesEqualTheFormula) { expect_formula(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, CommVolume,
                         ::testing::Values(Case{1, 1, 1, "gpipe", 8}, Case{4, 1, 1, "gpipe", 2},
                                           Case{2, 2, 1, "1f1b", 4}, Case{1, 2, 2, "stp", 8}, Case{2, 1, 2, "gpipe", 4},
                                           Case{2, 2, 1, "1f1b-i", 4}, Case{2, 2, 2, "zb-v", 4},
                                           Case{1, 4, 1, "stp", 8}, Case{4, 1, 1, "gpipe", 2, true},
                                           Case{2, 2, 1, "1f1b-i", 4, true}, Case{2, 2, 2, "zb-v", 4, true},
                                           Case{2, 1, 1, "gpipe", 4, true, true}, Case{2, 2, 2, "zb-v", 4, true, true}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return stp::testing::layout_case_name(p) + (p.param.distributed ? "_distributed" : "") +
                                  (p.param.bf16 ? "_bf16" : "");
                         });

// Untied (an lm_head apart from the embedding: no tied sum, both in a one-stage replica) with
// biases on q, k and v, and tied with grouped k/v heads and the vocabulary split over tp 2.
TEST(LlamaCommVolume, MeasuredBytesEqualTheFormula) {
  const std::vector<std::string> llama = {"model.arch=llama", "model.n_layer=4", "model.n_kv_head=2",
                                          "model.intermediate_size=48"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), llama.begin(), llama.end());
    return more;
  };
  const std::vector<std::string> untied = with({"model.tie_embeddings=false", "model.qkv_bias=true"});
  const std::vector<std::string> tied_vocab = with({"model.tie_embeddings=true", "parallel.vocab_parallel=true"});
  for (const Case& c : {Case{2, 2, 1, "1f1b-i", 4}, Case{2, 1, 1, "gpipe", 4, true, true}}) {
    SCOPED_TRACE(::testing::PrintToString(c) + " untied");
    expect_formula(c, untied);
  }
  for (const Case& c : {Case{2, 2, 2, "1f1b-i", 4}, Case{2, 2, 2, "zb-v", 4, true, true}}) {
    SCOPED_TRACE(::testing::PrintToString(c) + " tied, vocab-parallel");
    expect_formula(c, tied_vocab);
  }
}

}  // namespace
