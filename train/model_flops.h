// Model FLOPs per trained token, for the MFU metric (docs/config.md, train.peak_flops):
//
//   flops_per_token = 6 · N + 12 · L · C · T
//
// N = the parameters a token's matrix multiplies use: every parameter except the embedding
// lookups (gpt2: wpe, with the tied wte counted once, as the LM head's weight; llama: the
// untied embed_tokens, while lm_head counts); 6 = 2 FLOPs per multiply-add × (forward + two
// backward GEMMs).
// 12 · L · C · T: attention scores and weighted values, 2 · 2 · C · T per layer forward, × 3 for
// forward and backward, counting the full T × T (causal masking not subtracted), as PaLM's MFU
// does. Recomputation is not counted (model FLOPs, not hardware FLOPs).
#pragma once

#include <cstdint>

namespace stp {

struct Config;

double model_flops_per_token(const Config& config);

}  // namespace stp
