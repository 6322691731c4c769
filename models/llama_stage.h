// LlamaStage: a Llama-family chunk (LlamaForCausalLM / Qwen2ForCausalLM) on one TP rank. The units,
// their protocol and all microbatch state are StageBase's (models/stage_base.h); this class supplies
// the Llama unit math (models/llama_units.h: RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention, a tied or separate LM head) and its parameters (models/llama_params.h).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/llama_params.h"
#include "models/llama_units.h"
#include "models/model_spec.h"
#include "models/stage_base.h"

namespace stp {

class LlamaStage final : public StageBase {
 public:
  // alloc: the device allocator for parameters, records and temporaries (must outlive the stage).
  LlamaStage(const ModelSpec& config, const StageSpec& spec, Allocator& alloc);

  const LlamaDims& dims() const { return dims_; }

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
  const LlamaBranch& branch(int u) const { return branches_[static_cast<std::size_t>(u)]; }

  LlamaDims dims_;
  std::string head_weight_;            // lm_head.weight, or model.embed_tokens.weight when tied
  std::vector<LlamaBranch> branches_;  // [unit]; attn / mlp units only
};

}  // namespace stp
