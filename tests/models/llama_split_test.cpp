// Llama-family stages: the split backward and recompute are bitwise neutral. Deferring every W
// until after all B gives bitwise the gradients of fused B/W (W in the same order per tensor: a
// tied embedding has two writers, the head's W and the embedding's W, whose order is the order of
// its sum); Selective and Full recompute give
// bitwise the loss and gradients of None and hold exactly recompute_saving fewer bytes between F
// and B. Two microbatches in flight, tp 1 and 2, naive and fused attention, the gqa and qwen2
// reference models (tools/reference/gen_llama_reference.py).
#include <gtest/gtest.h>

#include "tests/models/llama_test_util.h"

namespace stp::testing {
namespace {

struct PassResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> grads;
  std::size_t held_after_f = 0;  // record bytes of rank 0 after both microbatches' F
};

PassResult run(const char* variant, int tp, AttentionKernel attention, Recompute r, bool defer_w) {
  const RefFile& ref = llama_reference(variant);
  const ModelSpec model = llama_reference_model(ref, attention);
  TpGroup g(model, StageSpec{0, model.n_layer, 0, tp, llama_reference_batch(ref)}, tp);
  g.load(ref);
  for (int rank = 0; rank < tp; ++rank)
    for (int u = 0; u < g.num_units(); ++u)
      if (g.stage(rank).unit_name(u).find(".attn") != std::string::npos ||
          g.stage(rank).unit_name(u).find(".mlp") != std::string::npos)
        g.stage(rank).set_recompute(u, r);
  g.zero_grads();
  for (int rank = 0; rank < tp; ++rank) g.stage(rank).set_loss_scale(0.5f);
  for (int mb = 0; mb < 2; ++mb) g.feed(ref, mb);
  for (int mb = 0; mb < 2; ++mb)
    for (int u = 0; u < g.num_units(); ++u) g.forward(u, mb);
  PassResult out;
  g.sync();
  out.held_after_f = g.stage().live_record_bytes();
  for (int mb = 0; mb < 2; ++mb) out.losses.push_back(host_copy(g.stage().loss(mb), g.compute())[0]);
  for (int mb = 0; mb < 2; ++mb)
    for (int u = g.num_units() - 1; u >= 0; --u) {
      g.backward_input(u, mb);
      if (!defer_w) g.backward_weight(u, mb);
    }
  if (defer_w)
    for (int mb = 0; mb < 2; ++mb)
      for (int u = g.num_units() - 1; u >= 0; --u) g.backward_weight(u, mb);
  for (ParamInfo& p : g.stage().params()) out.grads[p.name] = g.full_grad(p.name);
  EXPECT_EQ(g.stage().live_record_bytes(), 0u);
  return out;
}

std::size_t saving(const char* variant, int tp, AttentionKernel attention, Recompute r) {
  const RefFile& ref = llama_reference(variant);
  const ModelSpec model = llama_reference_model(ref, attention);
  TpGroup g(model, StageSpec{0, model.n_layer, 0, tp, llama_reference_batch(ref)}, tp);
  std::size_t total = 0;
  for (int u = 0; u < g.num_units(); ++u) total += g.stage().recompute_saving(u, r);
  return total;
}

TEST(LlamaSplit, DeferredWeightGradientsAndRecomputeAreBitwiseNeutral) {
  for (const char* variant : {"gqa", "qwen2"})
    for (int tp : {1, 2})
      for (AttentionKernel a : {AttentionKernel::Naive, AttentionKernel::Fused}) {
        SCOPED_TRACE(std::string(variant) + " tp " + std::to_string(tp) +
                     (a == AttentionKernel::Fused ? " fused" : " naive"));
        const PassResult base = run(variant, tp, a, Recompute::None, false);
        for (auto [r, defer] : {std::pair{Recompute::None, true}, std::pair{Recompute::Selective, false},
                                std::pair{Recompute::Full, true}}) {
          SCOPED_TRACE(std::string(to_string(r)) + (defer ? ", deferred W" : ""));
          const PassResult other = run(variant, tp, a, r, defer);
          EXPECT_EQ(other.losses, base.losses);
          for (const auto& [name, grad] : base.grads) EXPECT_EQ(other.grads.at(name), grad) << name;
          const std::size_t saved = 2 * saving(variant, tp, a, r);  // two microbatches
          EXPECT_EQ(other.held_after_f + saved, base.held_after_f);
          if (r != Recompute::None) {
            EXPECT_GT(saved, 0u);
          }
        }
      }
}

}  // namespace
}  // namespace stp::testing
