// The parameters of one GPT-2 stage (GPT2LMHeadModel): HF names, full shapes, how each TP rank's
// shard maps into the full tensor, which ones GEMMs multiply by, and GPT-2's init (the store itself:
// models/param_store.h). Semantics are HF GPT-2: learned positions (seq_len of them), pre-LayerNorm
// (eps 1e-5), causal attention, tanh GELU, final LayerNorm, LM head tied to the token embedding,
// mean token cross-entropy, no dropout. Of a ModelSpec (models/model_spec.h) GPT-2 reads n_layer,
// n_head, n_embd, vocab_size, seq_len, precision and attention; the other keys are Llama's.
//
// Tensor parallelism (Megatron, no sequence parallelism), TP rank r of t, Cl = C/t, H = n_head/t:
//   c_attn.weight [C, 3C]  column-parallel per section: columns [r*Cl, (r+1)*Cl) of each of q, k, v
//                          -> local [C, 3*Cl] laid out [q_r | k_r | v_r] (local heads r*H..r*H+H-1)
//   c_attn.bias   [3C]     the same three slices
//   attn.c_proj.weight [C, C]   row-parallel: rows [r*Cl, (r+1)*Cl) -> [Cl, C]
//   mlp.c_fc.weight [C, 4C]     column-parallel: columns [r*4Cl, (r+1)*4Cl) -> [C, 4Cl]; bias alike
//   mlp.c_proj.weight [4C, C]   row-parallel: rows [r*4Cl, (r+1)*4Cl) -> [4Cl, C]
//   c_proj biases, LayerNorms, wte, wpe: replicated (every rank holds the full tensor).
// The embedding and the LM head are replicated and computed identically on every TP rank (see
// docs/model.md): exact, no vocab-parallel cross-entropy, at the price of duplicated head FLOPs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model_spec.h"
#include "models/param_store.h"
#include "models/stage.h"

namespace stp {

// Throws stp::Error naming the keys when the model or the split is invalid (tp not dividing n_head,
// an untied head, ...).
void gpt2_validate(const ModelSpec& model, const StageSpec& spec);

// Name, full shape, flags and shard layout of every parameter of the stage, in a fixed order
// (embedding, layers in order, ln_f). param/grad are left undefined.
std::vector<ParamInfo> gpt2_param_table(const ModelSpec& model, const StageSpec& spec);

// The stage's ParamStore: GPT-2's init (normal(0, 0.02); c_proj weights 0.02/sqrt(2*n_layer);
// biases 0; LN 1/0); at bf16, copies of c_attn, c_proj, c_fc and (last stage) wte for the GEMMs.
ParamStore gpt2_param_store(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);

}  // namespace stp
