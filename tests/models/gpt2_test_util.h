// Helpers of the GPT-2 model tests: the tiny reference (tools/reference/gen_gpt2_reference.py), its model and
// batch, and a GPT-2 stage over emulated TP ranks (tests/models/model_test_util.h has the rest).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt2_stage.h"
#include "tests/models/model_test_util.h"

namespace stp::testing {

inline const std::map<std::string, RefTensor>& reference() {
  static const auto ref = read_reference(std::string(STP_SOURCE_DIR) + "/tests/models/data/gpt2_tiny_ref.bin");
  return ref;
}

inline ModelSpec reference_config() {
  const auto& c = reference().at("config").data;
  ModelSpec cfg;
  cfg.n_layer = static_cast<int>(c[0]);
  cfg.n_head = static_cast<int>(c[1]);
  cfg.n_embd = static_cast<int>(c[2]);
  cfg.vocab_size = static_cast<int>(c[3]);
  cfg.seq_len = static_cast<int>(c[4]);
  return cfg;
}
inline int reference_batch() { return static_cast<int>(reference().at("config").data[5]); }

// A GPT-2 stage on `tp` emulated TP ranks (TpStages), loading the tiny reference's parameters.
class TpStage : public TpStages<GPT2Stage> {
 public:
  TpStage(const ModelSpec& cfg, StageSpec spec, int tp)
      : TpStages(spec, tp, [cfg](const StageSpec& s, Allocator& a) { return std::make_unique<GPT2Stage>(cfg, s, a); }) {
  }
  void load_reference_params() { load(reference()); }
};

// Fills the microbatch inputs of the reference batch (rows [row0, row0 + B) of it).
inline void feed_reference_batch(TpStage& ts, int mb, int row0 = 0) {
  const auto& ref = reference();
  const int T = reference_config().seq_len;
  for (int r = 0; r < ts.tp(); ++r) {
    GPT2Stage& st = ts.stage(r);
    std::size_t n = static_cast<std::size_t>(st.dims().N());
    std::size_t off = static_cast<std::size_t>(row0 * T);
    if (st.is_first())
      fill_ids(st.tokens(mb),
               std::vector<float>(ref.at("tokens").data.begin() + off, ref.at("tokens").data.begin() + off + n));
    if (st.is_last())
      fill_ids(st.targets(mb),
               std::vector<float>(ref.at("targets").data.begin() + off, ref.at("targets").data.begin() + off + n));
  }
}

// F of all units, then B and W fused (B(u), W(u), B(u-1), ...).
inline void run_fused(TpStage& ts, int mb) {
  for (int u = 0; u < ts.num_units(); ++u) ts.forward(u, mb);
  for (int u = ts.num_units() - 1; u >= 0; --u) {
    ts.backward_input(u, mb);
    ts.backward_weight(u, mb);
  }
}

// One microbatch of the reference batch through a GPT-2 model of the reference's shape (cfg: with
// the precision and attention kernel under test) on 1 and 2 TP ranks, F then B and W fused: the
// loss within loss_rel (relative) of torch's, every parameter gradient within grad_scaled
// (scaled_error) of torch's, and no record left on any rank. Prints the errors, labelled `what`.
inline void expect_matches_torch(const ModelSpec& cfg, double loss_rel, double grad_scaled, const char* what) {
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    TpStage ts(cfg, StageSpec{0, cfg.n_layer, 0, tp, reference_batch()}, tp);
    ts.load_reference_params();
    ts.zero_grads();
    feed_reference_batch(ts, 0);
    run_fused(ts, 0);
    const float loss = host_copy(ts.stage().loss(0), ts.compute())[0];
    const double ref_loss = reference().at("loss").data[0];
    EXPECT_NEAR(loss, ref_loss, loss_rel * ref_loss);
    double worst = 0;
    std::string worst_name;
    for (ParamInfo& p : ts.stage().params()) {
      const double err = scaled_error(ts.full_grad(p.name), reference().at("grad." + p.name).data);
      EXPECT_LT(err, grad_scaled) << p.name;
      if (err > worst) worst = err, worst_name = p.name;
    }
    std::printf("[ %s tp %d ] loss rel %.2e, worst gradient scaled error %.2e (%s)\n", what, tp,
                std::fabs(loss - ref_loss) / ref_loss, worst, worst_name.c_str());
    for (int r = 0; r < tp; ++r) EXPECT_EQ(ts.stage(r).live_record_bytes(), 0u);
  }
}

}  // namespace stp::testing
