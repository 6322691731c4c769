#include "train/model_flops.h"

#include "config/config.h"

namespace stp {

double model_flops_per_token(const Config& config) {
  const double C = config.model.n_embd, L = config.model.n_layer, T = config.model.seq_len, V = config.model.vocab_size;
  // Per block: ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (weights and biases).
  const double block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  const double n = L * block + 2 * C + V * C;  // + ln_f + wte (the head)
  return 6 * n + 12 * L * C * T;
}

}  // namespace stp
