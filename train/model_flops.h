// Model FLOPs per trained token, for the MFU metric (docs/config.md, train.peak_flops):
//
//   flops_per_token = 6 · N + 3 · A
//
// N = the parameters a token's matrix multiplies use: every parameter except the lookup-only
// embeddings (the architecture counts them: Architecture::matmul_params, models/registry.h);
// 6 = 2 FLOPs per multiply-add × (forward + two backward GEMMs). A = the forward FLOPs of
// attention's scores and weighted values (Architecture::attention_flops_per_token: 4 · L · C · T
// for queries C wide), counting the full T × T (causal masking not subtracted), as PaLM's MFU
// does. Recomputation is not counted (model FLOPs, not hardware FLOPs).
#pragma once

#include <cstdint>

namespace stp {

struct Config;

double model_flops_per_token(const Config& config);

}  // namespace stp
