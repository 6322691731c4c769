// GPT-2 against PyTorch (float64 reference, tools/reference/gen_gpt2_reference.py): logits, loss, every
// parameter gradient, and the losses of 10 AdamW steps.
//
// Tolerance: 1e-5 relative to each tensor's scale (max |ours - ref| / max |ref|). Our float32
// kernels differ from the exact answer by rounding only (observed errors are ~1e-7 .. 1e-6).
#include <gtest/gtest.h>

#include "core/kernels/optim_kernels.h"
#include "tests/models/gpt2_test_util.h"

namespace stp::testing {
namespace {

constexpr double kTol = 1e-5;

// On 1, 2 and 4 TP ranks, the vocabulary replicated and (tp > 1) vocab-parallel.
struct TpCase {
  int tp;
  bool vocab_parallel;
};

class GPT2ReferenceTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(GPT2ReferenceTp, LogitsLossAndGradientsMatchTorch) {
  const TpCase c = GetParam();
  StageSpec spec{0, reference_config().n_layer, 0, c.tp, reference_batch()};
  spec.vocab_parallel = c.vocab_parallel;
  TpStage ts(reference_config(), spec, c.tp);
  ts.load_reference_params();
  ts.zero_grads();
  feed_reference_batch(ts, 0);
  GPT2Stage& st = ts.stage();
  for (int u = 0; u < st.num_units(); ++u) ts.forward(u, 0);

  // Logits are the head's record until B turns them into dlogits in place; every rank holds the
  // whole row, or its columns when vocab-parallel, and the same loss.
  const std::int64_t V = reference_config().vocab_size;
  for (int r = 0; r < ts.tp(); ++r) {
    Tensor logits;
    for (const ActivationRecord& rec : ts.stage(r).activation_records(st.num_units() - 1, 0))
      if (rec.name == "head.logits") logits = rec.tensor;
    ASSERT_TRUE(logits.defined());
    const std::int64_t Vs = logits.shape().back();
    EXPECT_EQ(Vs, c.vocab_parallel ? vocab_rows(V, c.tp) : V);
    EXPECT_LT(logits_error(host_copy(logits, ts.compute(r)), reference().at("logits").data, V, Vs, r), kTol);
    float loss = host_copy(ts.stage(r).loss(0), ts.compute(r))[0];
    EXPECT_NEAR(loss, reference().at("loss").data[0], kTol * reference().at("loss").data[0]) << "rank " << r;
  }

  for (int u = st.num_units() - 1; u >= 0; --u) {
    ts.backward_input(u, 0);
    ts.backward_weight(u, 0);
  }
  for (ParamInfo& p : st.params()) {
    double err = scaled_error(ts.full_grad(p.name), reference().at("grad." + p.name).data);
    EXPECT_LT(err, kTol) << p.name;
  }
  for (int r = 0; r < ts.tp(); ++r) EXPECT_EQ(ts.stage(r).live_record_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Splits, GPT2ReferenceTp,
                         ::testing::Values(TpCase{1, false}, TpCase{2, false}, TpCase{2, true}, TpCase{4, false},
                                           TpCase{4, true}),
                         [](const ::testing::TestParamInfo<TpCase>& i) {
                           return "tp" + std::to_string(i.param.tp) + (i.param.vocab_parallel ? "_vocab" : "");
                         });

// bf16 precision (docs/model.md, "Precision") against the same float64 reference, on 1 and 2 TP
// ranks. Every activation between GEMMs and every GEMM weight is rounded to 8 significant bits
// (relative error <= 2^-9 = 2e-3 each), and a gradient sees a chain of such roundings through
// every layer. Tolerance: scaled error 2e-2 for gradients (about ten bf16 roundings; measured
// ~2e-3 .. 8e-3), relative 2e-3 for the loss (a mean over tokens averages the rounding out;
// measured ~1e-4). A kernel that stored or read the wrong type, or a stale weight copy, is off by
// O(1).
TEST(GPT2Reference, Bf16LossAndGradientsMatchTorchWithinBf16Rounding) {
  ModelSpec cfg = reference_config();
  cfg.precision = DType::Bf16;
  expect_matches_torch(cfg, 2e-3, 2e-2, "bf16");
}

TEST(GPT2Reference, TenAdamWStepsMatchTorch) {
  const auto& hyper = reference().at("adamw.hyper").data;
  const auto& want = reference().at("adamw.losses").data;
  TpStage ts(reference_config(), StageSpec{0, reference_config().n_layer, 0, 1, reference_batch()}, 1);
  ts.load_reference_params();
  GPT2Stage& st = ts.stage();
  Stream& s = ts.compute();
  // AdamW moments, one pair per parameter.
  DeviceAllocator alloc(s.device());
  std::vector<Tensor> m, v;
  for (ParamInfo& p : st.params()) {
    m.push_back(Tensor::empty(alloc, p.param.shape()));
    v.push_back(Tensor::empty(alloc, p.param.shape()));
    s.zero(m.back().raw(), m.back().bytes());
    s.zero(v.back().raw(), v.back().bytes());
  }
  AdamWHyper h{hyper[1], hyper[2], hyper[3], hyper[4]};
  for (std::size_t step = 1; step <= want.size(); ++step) {
    ts.zero_grads();
    feed_reference_batch(ts, 0);
    run_fused(ts, 0);
    float loss = host_copy(st.loss(0), s)[0];
    EXPECT_NEAR(loss, want[step - 1], kTol * want[step - 1]) << "step " << step;
    for (std::size_t i = 0; i < st.params().size(); ++i) {
      ParamInfo& p = st.params()[i];
      adamw_step(s, p.param.f32(), p.grad.f32(), m[i].f32(), v[i].f32(), static_cast<std::size_t>(p.param.numel()),
                 hyper[0], h, static_cast<int>(step), p.decay);
    }
  }
  s.synchronize();
}

}  // namespace
}  // namespace stp::testing
