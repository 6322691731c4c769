// GPT2Stage: a GPT-2 chunk on one TP rank. The units, their protocol and all microbatch state are
// StageBase's (models/stage_base.h); this class supplies GPT-2's unit math (models/gpt2_units.h:
// learned positions, pre-LayerNorm attention and GELU MLP, the head tied to wte) and its parameters
// (models/gpt2_params.h). Recompute: models/gpt2_units.h lists the records per policy.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "models/gpt2_config.h"
#include "models/gpt2_params.h"
#include "models/gpt2_units.h"
#include "models/stage_base.h"

namespace stp {

class GPT2Stage final : public StageBase {
 public:
  // alloc: the device allocator for parameters, records and temporaries (must outlive the stage).
  GPT2Stage(const GPT2Config& config, const GPT2StageSpec& spec, Allocator& alloc);

  const GPT2Dims& dims() const { return dims_; }

 private:
  Tensor embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) override;
  void embed_backward_weight(RecordSet& rec, CallScope& cs) override;
  Tensor branch_forward(int u, const Tensor& x, RecordSet& rec, CallScope& cs) override;
  Tensor branch_backward_input(int u, const Tensor& dy, RecordSet& rec, CallScope& cs) override;
  void branch_backward_weight(int u, RecordSet& rec, CallScope& cs) override;
  Tensor finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) override;
  std::vector<RecomputedRecord> branch_recomputed_records(int u, Recompute r) const override;
  double branch_recompute_cost(int u, Recompute r) const override;
  void branch_recompute(int u, Recompute r, RecordSet& rec, CallScope& cs) override;
  void head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, RecordSet& rec, CallScope& cs) override;
  Tensor head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) override;
  void head_backward_weight(RecordSet& rec, CallScope& cs) override;

  bool is_attn(int u) const { return unit_kind(u) == UnitKind::Attn; }
  const BranchParams& branch(int u) const { return branches_[static_cast<std::size_t>(u)]; }
  LayerNormParams ln_f() { return {&params_.at("ln_f.weight"), &params_.at("ln_f.bias")}; }

  GPT2Dims dims_;
  std::vector<BranchParams> branches_;  // [unit]; attn / mlp units only
};

}  // namespace stp
