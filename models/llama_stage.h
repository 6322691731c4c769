// LlamaStage: a Llama-family chunk (LlamaForCausalLM / Qwen2ForCausalLM) on one TP rank. The units,
// their protocol and all microbatch state are StageBase's (models/stage_base.h, through models/branched_stage.h); this
// class supplies the Llama unit math (models/llama_units.h: RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention, a tied or separate LM head) and its parameters (models/llama_params.h).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/llama_params.h"
#include "models/llama_units.h"
#include "models/model_spec.h"
#include "models/branched_stage.h"

namespace stp {

class LlamaStage final : public BranchedStage<LlamaDims, LlamaBranch> {
 public:
  // alloc: the device allocator for parameters, records and temporaries (must outlive the stage).
  LlamaStage(const ModelSpec& config, const StageSpec& spec, Allocator& alloc);

  void prepare_kernels(Stream& s) override { llama_prepare_kernels(dims_, s); }

 private:
  Tensor embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) override;
  void embed_backward_weight(RecordSet& rec, CallScope& cs) override;
  Tensor finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) override;
  void head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, const LossChunking& c, RecordSet& rec,
                    CallScope& cs) override;
  Tensor head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) override;
  void head_backward_weight(RecordSet& rec, CallScope& cs) override;

  std::string head_weight_;  // lm_head.weight, or model.embed_tokens.weight when tied
};

}  // namespace stp
