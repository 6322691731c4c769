// The parameters of one Llama-family stage (LlamaForCausalLM / Qwen2ForCausalLM): names, full
// shapes, how each TP rank's shard maps into the full tensor, which ones GEMMs multiply by, and the
// init (the store itself: models/param_store.h).
//
// Internal names and layouts, and their HF equivalents (W^T: HF's nn.Linear weight [out, in],
// transposed into stp's [in, out] GEMM layout; i = layer):
//   model.embed_tokens.weight                  [V, C]          = HF, same name
//   model.layers.i.input_layernorm.weight      [C]             = HF, same name
//   model.layers.i.self_attn.qkv_proj.weight   [C, (H+2K)D]    = [q_proj.weight^T | k_proj.weight^T | v_proj.weight^T]
//   model.layers.i.self_attn.qkv_proj.bias     [(H+2K)D]       = [q_proj.bias | k_proj.bias | v_proj.bias] (qkv_bias)
//   model.layers.i.self_attn.o_proj.weight     [HD, C]         = o_proj.weight^T
//   model.layers.i.post_attention_layernorm.weight [C]         = HF, same name
//   model.layers.i.mlp.gate_up_proj.weight     [C, 2I]         = [gate_proj.weight^T | up_proj.weight^T]
//   model.layers.i.mlp.down_proj.weight        [I, C]          = down_proj.weight^T
//   model.norm.weight                          [C]             = HF, same name
//   lm_head.weight                             [V, C]          = HF, same name (untied only; tied: the
//                                                                head multiplies by model.embed_tokens.weight)
// H = n_head, K = n_kv_head, D = n_embd / n_head, I = intermediate_size.
//
// Tensor parallelism (Megatron, no sequence parallelism), TP rank r of t:
//   qkv_proj   column-parallel per section: q heads [r*H/t, (r+1)*H/t), k and v heads
//              [r*K/t, (r+1)*K/t) -> local [C, (H+2K)D/t] laid out [q_r | k_r | v_r]; bias alike
//   o_proj     row-parallel: rows of the local q heads -> [HD/t, C]
//   gate_up    column-parallel per section: [gate_r | up_r], each I/t wide
//   down_proj  row-parallel: rows [r*I/t, (r+1)*I/t) -> [I/t, C]
//   norms, embed_tokens, lm_head: replicated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model_spec.h"
#include "models/param_store.h"
#include "models/stage.h"

namespace stp {

// Throws stp::Error naming the keys when the model or the split is invalid.
void llama_validate(const ModelSpec& model, const StageSpec& spec);

// Every parameter of the stage in a fixed order (embedding, layers, norm, lm_head); param/grad
// left undefined.
std::vector<ParamInfo> llama_param_table(const ModelSpec& model, const StageSpec& spec);

// The name of the tensor the LM head multiplies by.
std::string llama_head_weight(const ModelSpec& model);

// The stage's ParamStore: HF's init (normal(0, 0.02) weights, biases 0, norms 1); at bf16, copies
// of the projections and (last stage) the head weight for the GEMMs.
ParamStore llama_param_store(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);

}  // namespace stp
