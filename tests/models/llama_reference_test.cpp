// Llama-family stages against PyTorch (float64 reference, tools/reference/gen_llama_reference.py): logits,
// loss and every parameter gradient, for grouped-query attention with an untied head (gqa), q/k/v
// biases with a tied head (qwen2) and multi-head attention (mha), on 1, 2 and 4 TP ranks, with the
// naive and the fused attention kernel, with the vocabulary replicated and (tp > 1) vocab-parallel.
//
// Tolerance: 1e-5 relative to each tensor's scale (max |ours - ref| / max |ref|), as for GPT-2
// (gpt2_reference_test.cpp): our float32 kernels differ from the exact answer by rounding only.
#include <gtest/gtest.h>

#include "tests/models/llama_test_util.h"

namespace stp::testing {
namespace {

constexpr double kTol = 1e-5;

struct Case {
  const char* variant;
  int tp;
  AttentionKernel attention;
  bool vocab_parallel;
};

class LlamaReference : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaReference, LogitsLossAndGradientsMatchTorch) {
  const Case c = GetParam();
  const RefFile& ref = llama_reference(c.variant);
  const ModelSpec model = llama_reference_model(ref, c.attention);
  StageSpec spec{0, model.n_layer, 0, c.tp, llama_reference_batch(ref)};
  spec.vocab_parallel = c.vocab_parallel;
  TpGroup g(model, spec, c.tp);
  g.load(ref);
  g.zero_grads();
  g.feed(ref, 0);
  for (int u = 0; u < g.num_units(); ++u) g.forward(u, 0);

  for (int r = 0; r < g.tp(); ++r) {  // every TP rank computes the head (its columns when vocab-parallel)
    Tensor logits;
    for (const ActivationRecord& rec : g.stage(r).activation_records(g.num_units() - 1, 0))
      if (rec.name == "head.logits") logits = rec.tensor;
    ASSERT_TRUE(logits.defined());
    const std::int64_t Vs = logits.shape().back();
    EXPECT_EQ(Vs, c.vocab_parallel ? vocab_rows(model.vocab_size, c.tp) : model.vocab_size);
    EXPECT_LT(logits_error(host_copy(logits, g.compute(r)), ref.at("logits").data, model.vocab_size, Vs, r), kTol)
        << "rank " << r;
    const float loss = host_copy(g.stage(r).loss(0), g.compute(r))[0];
    EXPECT_NEAR(loss, ref.at("loss").data[0], kTol * ref.at("loss").data[0]) << "rank " << r;
  }

  for (int u = g.num_units() - 1; u >= 0; --u) {
    g.backward_input(u, 0);
    g.backward_weight(u, 0);
  }
  int compared = 0;
  for (ParamInfo& p : g.stage().params()) {
    EXPECT_LT(scaled_error(g.full_grad(p.name), ref.at("grad." + p.name).data), kTol) << p.name;
    ++compared;
  }
  int want = 0;
  for (const auto& [name, t] : ref) want += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, want) << "every reference gradient is compared";
  for (int r = 0; r < g.tp(); ++r) EXPECT_EQ(g.stage(r).live_record_bytes(), 0u);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* v : {"gqa", "qwen2", "mha"})
    for (int tp : {1, 2, 4})
      for (AttentionKernel a : {AttentionKernel::Naive, AttentionKernel::Fused})
        for (bool vocab : {false, true})
          if (tp > 1 || !vocab) out.push_back({v, tp, a, vocab});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.variant) + "_tp" + std::to_string(info.param.tp) +
         (info.param.attention == AttentionKernel::Fused ? "_fused" : "_naive") +
         (info.param.vocab_parallel ? "_vocab" : "");
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaReference, ::testing::ValuesIn(cases()), case_name);

// bf16 precision against the same float64 reference, as GPT2Reference's bf16 test: loss within
// 2e-3 relative; every gradient within 2e-2 of its scale for a 2-layer model (mha; about ten bf16
// roundings along a gradient's chain, GPT-2's bound at the same depth). The chain grows with the
// depth, so the 8-layer variants (gqa, qwen2) get 4 x 2e-2 (measured 3e-2 .. 5e-2; mha 1.1e-2 .. 1.3e-2;
// losses 1e-4 .. 4e-4). A kernel that
// stored or read the wrong type, or a stale weight copy, is off by O(1).
TEST(LlamaReferenceBf16, LossAndGradientsMatchTorchWithinBf16Rounding) {
  for (const char* variant : {"mha", "gqa", "qwen2"})
    for (AttentionKernel attention : {AttentionKernel::Naive, AttentionKernel::Fused})
      for (int tp : {1, 2}) {
        SCOPED_TRACE(std::string(variant) + " tp " + std::to_string(tp) +
                     (attention == AttentionKernel::Fused ? " fused" : " naive"));
        const RefFile& ref = llama_reference(variant);
        ModelSpec model = llama_reference_model(ref, attention);
        model.precision = DType::Bf16;
        const double tol = 2e-2 * (model.n_layer / 2);
        TpGroup g(model, StageSpec{0, model.n_layer, 0, tp, llama_reference_batch(ref)}, tp);
        g.load(ref);
        g.zero_grads();
        g.feed(ref, 0);
        for (int u = 0; u < g.num_units(); ++u) g.forward(u, 0);
        for (int u = g.num_units() - 1; u >= 0; --u) {
          g.backward_input(u, 0);
          g.backward_weight(u, 0);
        }
        const double want = ref.at("loss").data[0];
        const double loss = host_copy(g.stage().loss(0), g.compute())[0];
        EXPECT_NEAR(loss, want, 2e-3 * want);
        double worst = 0;
        for (ParamInfo& p : g.stage().params()) {
          const double err = scaled_error(g.full_grad(p.name), ref.at("grad." + p.name).data);
          EXPECT_LT(err, tol) << p.name;
          worst = std::max(worst, err);
        }
        std::printf("[ bf16 %s tp %d ] loss rel %.2e, worst gradient scaled error %.2e (bound %.0e)\n", variant, tp,
                    std::fabs(loss - want) / want, worst, tol);
      }
}

TEST(LlamaConfig, TpNotDividingKvHeadsIsAClearError) {
  const ModelSpec model = llama_reference_model(llama_reference("gqa"));  // 8 heads, 4 kv heads
  try {
    validate_model(model, StageSpec{0, model.n_layer, 0, 8, 1});
    FAIL() << "tp 8 accepted with 4 kv heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head (4)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stp::testing
