// How an architecture's full parameter tensors map onto Hugging Face tensor names and layouts
// (the names transformers' from_pretrained expects in model.safetensors). Pure description: the
// conversion itself (train/hf_convert.h) only moves values, so export and import are bitwise.
//
// Each rule describes one stp tensor `name` of full shape `shape`:
//   * 1-D tensors are cut into [begin, end) ranges, one HF tensor each;
//   * 2-D tensors [in, out] are cut into column ranges [begin, end); a part with `transpose` is
//     stored as HF's nn.Linear weight [end - begin, in] (the columns transposed), otherwise as
//     [in, end - begin] (GPT-2's Conv1D keeps stp's [in, out] layout).
//
// Example (llama, layer 0, H = 4 heads, K = 2 kv-heads of D = 8, C = 32):
//   model.layers.0.self_attn.qkv_proj.weight [32, 64] ->
//     model.layers.0.self_attn.q_proj.weight [32, 32] = columns [0, 32) transposed
//     model.layers.0.self_attn.k_proj.weight [16, 32] = columns [32, 48) transposed
//     model.layers.0.self_attn.v_proj.weight [16, 32] = columns [48, 64) transposed
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model_spec.h"

namespace stp {

struct HfPart {
  std::string name;  // the HF tensor name
  std::int64_t begin = 0, end = 0;
  bool transpose = false;
};

struct HfTensorRule {
  std::string name;  // the stp parameter name (models/*_params.h)
  Shape shape;       // its full shape
  std::vector<HfPart> parts;
};

// Every parameter of the whole model (all layers), in the param tables' order. gpt2: the HF
// GPT-2 names unchanged (no "transformer." prefix); llama: q/k/v and gate/up split, every
// projection transposed to nn.Linear's [out, in]; tied models hold no lm_head.weight.
std::vector<HfTensorRule> hf_tensor_rules(const ModelSpec& model);

}  // namespace stp
