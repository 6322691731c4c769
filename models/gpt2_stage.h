// GPT2Stage: a GPT-2 chunk on one TP rank. The units, their protocol and all microbatch state are
// StageBase's (models/stage_base.h, through models/branched_stage.h); this class supplies GPT-2's unit math
// (models/gpt2_units.h: learned positions, pre-LayerNorm attention and GELU MLP, the head tied to wte) and its
// parameters (models/gpt2_params.h). Recompute: models/gpt2_units.h lists the records per policy.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "models/gpt2_params.h"
#include "models/gpt2_units.h"
#include "models/model_spec.h"
#include "models/branched_stage.h"

namespace stp {

class GPT2Stage final : public BranchedStage<GPT2Dims, GPT2Branch> {
 public:
  // alloc: the device allocator for parameters, records and temporaries (must outlive the stage).
  GPT2Stage(const ModelSpec& config, const StageSpec& spec, Allocator& alloc);

  void prepare_kernels(Stream& s) override { gpt2_prepare_kernels(dims_, s); }

 private:
  Tensor embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) override;
  void embed_backward_weight(RecordSet& rec, CallScope& cs) override;
  Tensor finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) override;
  void head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, const LossChunking& c, RecordSet& rec,
                    CallScope& cs) override;
  Tensor head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) override;
  void head_backward_weight(RecordSet& rec, CallScope& cs) override;

  GPT2LayerNorm ln_f() { return {&params_.at("ln_f.weight"), &params_.at("ln_f.bias")}; }
};

}  // namespace stp
