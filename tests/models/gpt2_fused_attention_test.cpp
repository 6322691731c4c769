// GPT-2 with fused attention (ModelSpec::attention = Fused, core/kernels/attention_kernels.h)
// against the same float64 PyTorch reference as the naive kernel (gpt2_reference_test.cpp), on 1
// and 2 TP ranks, and its activation records: the attention unit keeps y and one f32 log-sum-exp
// per query row instead of the (B, H, T, T) probabilities.
//
// Tolerances are those of the naive model and for the same reason: the fused kernel differs from
// the exact answer by f32 rounding only (tests/core/fused_attention_test.cpp bounds it per element,
// far below 1e-5 of each tensor's scale at these sizes); bf16: as
// GPT2Reference.Bf16LossAndGradientsMatchTorchWithinBf16Rounding.
#include <gtest/gtest.h>

#include "tests/models/gpt2_test_util.h"

namespace stp::testing {
namespace {

ModelSpec fused_config(DType precision = DType::F32) {
  ModelSpec cfg = reference_config();
  cfg.attention = AttentionKernel::Fused;
  cfg.precision = precision;
  return cfg;
}

void expect_fused_matches_torch(DType precision, double loss_rel, double grad_scaled) {
  expect_matches_torch(fused_config(precision), loss_rel, grad_scaled,
                       precision == DType::Bf16 ? "fused bf16" : "fused f32");
}

TEST(GPT2FusedAttention, LossAndGradientsMatchTorch) { expect_fused_matches_torch(DType::F32, 1e-5, 1e-5); }

TEST(GPT2FusedAttention, Bf16LossAndGradientsMatchTorchWithinBf16Rounding) {
  expect_fused_matches_torch(DType::Bf16, 2e-3, 2e-2);
}

// The attention unit's records after F: no (B, H, T, T) tensor; "lse" (B, H, T) f32 read by B;
// "y" read by B (the backward's do . o) and W (c_proj's weight gradient).
TEST(GPT2FusedAttention, RecordsAreLinearInTheSequenceLength) {
  const ModelSpec cfg = fused_config();
  TpStage ts(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, 1);
  ts.load_reference_params();
  ts.zero_grads();
  feed_reference_batch(ts, 0);
  GPT2Stage& st = ts.stage();
  for (int u = 0; u < st.num_units(); ++u) ts.forward(u, 0);
  ts.sync();
  const GPT2Dims& d = st.dims();
  std::map<std::string, const ActivationRecord*> recs;
  for (const ActivationRecord& r : st.activation_records(1, 0)) recs[r.name] = &r;
  EXPECT_EQ(recs.count("h.0.attn.att"), 0u);
  ASSERT_EQ(recs.count("h.0.attn.lse"), 1u);
  ASSERT_EQ(recs.count("h.0.attn.y"), 1u);
  EXPECT_EQ(recs["h.0.attn.lse"]->bytes, static_cast<std::size_t>(d.B * d.H * d.T * 4));
  EXPECT_EQ(recs["h.0.attn.lse"]->reader, RecordReader::B);
  EXPECT_EQ(recs["h.0.attn.y"]->reader, RecordReader::BW);
  EXPECT_EQ(recs.size(), 7u);  // ln.x, ln.mean, ln.rstd, ln.out, qkv, lse, y
  // Selective drops ln.out, lse and y; Full keeps only ln.x.
  EXPECT_EQ(st.recompute_saving(1, Recompute::Selective),
            static_cast<std::size_t>(d.N() * d.C * 4 + d.B * d.H * d.T * 4 + d.N() * d.Cl * 4));
  std::size_t all_but_input = 0;
  for (const auto& [name, r] : recs)
    if (name != "h.0.attn.ln.x") all_but_input += r->bytes;
  EXPECT_EQ(st.recompute_saving(1, Recompute::Full), all_but_input);
  const int U = st.num_units();
  for (int u = U - 1; u >= 0; --u) ts.backward_input(u, 0);
  for (int u = 0; u < U; ++u) ts.backward_weight(u, 0);
  EXPECT_EQ(st.live_record_bytes(), 0u);
}

}  // namespace
}  // namespace stp::testing
