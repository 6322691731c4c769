#include "train/model_flops.h"

#include "base/error.h"
#include "config/config.h"
#include "train/stage_layout.h"

namespace stp {

namespace {

// N of the header's formula, per architecture (the weight shapes of docs/model.md).
double matmul_params(const ModelSpec& m) {
  const double C = m.n_embd, L = m.n_layer, V = m.vocab_size;
  if (m.arch == "gpt2") {
    // Per block: ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (weights and biases).
    const double block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return L * block + 2 * C + V * C;  // + ln_f + wte (the head)
  }
  STP_ASSERT(m.arch == "llama", "model FLOPs of architecture ", m.arch, " are not defined");
  const double kv = static_cast<double>(m.n_kv_head) * (m.n_embd / m.n_head);  // k and v widths
  const double I = m.intermediate_size;
  const double attn = C * C + 2 * C * kv + C * C + (m.qkv_bias ? C + 2 * kv : 0);  // q, k, v (+ biases), o
  const double block = 2 * C + attn + 3 * C * I;  // two RMSNorms, attention, gate / up / down
  // + the final norm + the head (tied or not; the input lookup is free)
  return L * block + C + V * C;
}

}  // namespace

double model_flops_per_token(const Config& config) {
  const ModelSpec m = model_spec_of(config);
  return 6 * matmul_params(m) + 12.0 * m.n_layer * m.n_embd * m.seq_len;
}

}  // namespace stp
