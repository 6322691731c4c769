// Tensor parallelism: TP = 2 and TP = 4 (emulated CPU devices, HostComm all-reduce on a separate
// tp-comm stream per rank, event-ordered) give the loss and gradients of TP = 1 and of PyTorch.
// The batch is cut into two microbatches of one sequence each (loss scale 1/2), run with a
// braided order: F of microbatch 1 interleaves with B of microbatch 0, whose W's are deferred to
// the end; microbatch 1 runs B and W fused.
//
// Tolerance 1e-5 relative to each tensor's scale, as in gpt2_reference_test.cpp: TP changes only
// the summation order (partial GEMMs summed by the all-reduce), so results agree to rounding.
#include <gtest/gtest.h>

#include "tests/models/gpt2_test_util.h"

namespace stp::testing {
namespace {

constexpr double kTol = 1e-5;

struct Result {
  float loss = 0;  // mean over the two microbatches
  std::map<std::string, std::vector<float>> grads;
};

Result run_braided(int tp) {
  ModelSpec cfg = reference_config();
  TpStage ts(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch() / 2}, tp);
  ts.load_reference_params();
  ts.zero_grads();
  ts.set_loss_scale(0.5f);
  feed_reference_batch(ts, 0, 0);
  feed_reference_batch(ts, 1, 1);
  const int U = ts.num_units();
  for (int u = 0; u < U; ++u) ts.forward(u, 0);
  // F(u, mb 1) braided with B(U-1-u, mb 0), W of mb 0 deferred.
  for (int k = 0; k < U; ++k) {
    ts.forward(k, 1);
    ts.backward_input(U - 1 - k, 0);
  }
  for (int u = U - 1; u >= 0; --u) {
    ts.backward_input(u, 1);
    ts.backward_weight(u, 1);
  }
  for (int u = 0; u < U; ++u) ts.backward_weight(u, 0);
  ts.sync();
  Result res;
  for (int r = 0; r < tp; ++r) {
    float l0 = host_copy(ts.stage(r).loss(0), ts.compute(r))[0], l1 = host_copy(ts.stage(r).loss(1), ts.compute(r))[0];
    if (r == 0) res.loss = 0.5f * (l0 + l1);
    EXPECT_EQ(0.5f * (l0 + l1), res.loss) << "TP ranks disagree on the loss (rank " << r << ")";
    EXPECT_EQ(ts.stage(r).live_record_bytes(), 0u);
  }
  for (ParamInfo& p : ts.stage().params()) res.grads[p.name] = ts.full_grad(p.name);
  // Replicated parameters have bitwise identical grads on every TP rank.
  for (int r = 1; r < tp; ++r)
    for (ParamInfo& p : ts.stage(r).params())
      if (p.replicated) {
        EXPECT_EQ(host_copy(p.grad, ts.compute(r)), host_copy(ts.stage(0).param_store().at(p.name).grad, ts.compute(0)))
            << p.name;
      }
  return res;
}

void expect_close(const Result& got, const Result& want, const char* what) {
  EXPECT_NEAR(got.loss, want.loss, kTol * want.loss) << what;
  for (const auto& [name, g] : want.grads) EXPECT_LT(scaled_error(got.grads.at(name), g), kTol) << what << " " << name;
}

TEST(GPT2TensorParallel, Tp1BraidedMicrobatchesMatchTorch) {
  Result r = run_braided(1);
  Result ref;
  ref.loss = reference().at("loss").data[0];
  for (const auto& [name, g] : r.grads) ref.grads[name] = reference().at("grad." + name).data;
  expect_close(r, ref, "tp=1 vs torch");
}

TEST(GPT2TensorParallel, Tp2AndTp4MatchTp1) {
  Result one = run_braided(1);
  for (int tp : {2, 4}) {
    Result r = run_braided(tp);
    expect_close(r, one, tp == 2 ? "tp=2 vs tp=1" : "tp=4 vs tp=1");
  }
}

TEST(GPT2TensorParallel, ShardLayoutsRoundTrip) {
  ModelSpec cfg = reference_config();
  for (int tp : {2, 4}) {
    for (const ParamInfo& p : gpt2_param_table(cfg, StageSpec{0, cfg.n_layer, 0, tp, 1})) {
      // Every full element is covered by exactly one rank (or by all ranks, if replicated).
      std::vector<int> hits(static_cast<std::size_t>(numel(p.full_shape)), 0);
      for (int r = 0; r < tp; ++r) {
        ParamInfo q;
        for (const ParamInfo& x : gpt2_param_table(cfg, StageSpec{0, cfg.n_layer, r, tp, 1}))
          if (x.name == p.name) q = x;
        std::vector<float> shard(static_cast<std::size_t>(q.layout.shard_rows * q.layout.shard_cols), 1.0f);
        std::vector<float> full(hits.size(), 0.0f);
        q.layout.gather(shard.data(), full.data());
        for (std::size_t i = 0; i < full.size(); ++i) hits[i] += full[i] != 0.0f;
      }
      for (int h : hits) ASSERT_EQ(h, p.replicated ? tp : 1) << p.name << " tp=" << tp;
    }
  }
}

TEST(GPT2TensorParallel, RejectsTpNotDividingHeads) {
  ModelSpec cfg = reference_config();  // 4 heads
  EXPECT_THROW(gpt2_param_table(cfg, StageSpec{0, cfg.n_layer, 0, 3, 1}), Error);
}

}  // namespace
}  // namespace stp::testing
