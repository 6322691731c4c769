// GPT-2's registry entry (models/registry.h) and its arithmetic, from the parameter table of
// models/gpt2_params.h and the units of models/gpt2_units.h. C = n_embd, L = n_layer, V =
// vocab_size, T = seq_len; per layer: ln_1, c_attn [C, 3C] + bias, attn.c_proj [C, C] + bias, ln_2,
// c_fc [C, 4C] + bias, mlp.c_proj [4C, C] + bias.
#include <cstdint>
#include <memory>

#include "base/error.h"
#include "models/gpt2_params.h"
#include "models/gpt2_stage.h"
#include "models/registry.h"
#include "models/unit_common.h"

namespace stp {
namespace {

std::unique_ptr<Stage> gpt2_make(const ModelSpec& m, const StageSpec& s, Allocator& alloc) {
  return std::make_unique<GPT2Stage>(m, s, alloc);
}

// Every parameter but wpe (a lookup); the tied wte once, as the head's weight.
double gpt2_matmul_params(const ModelSpec& m) {
  const double C = m.n_embd, L = m.n_layer, V = m.vocab_size;
  // Per block: ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (weights and biases).
  const double block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return L * block + 2 * C + V * C;  // + ln_f + wte (the head)
}

// Scores q k^T and weighted values p v: 2 · 2 · T · C per layer (all heads together are C wide).
double gpt2_attention_flops(const ModelSpec& m) { return 4.0 * m.n_layer * m.n_embd * m.seq_len; }

double gpt2_unit_flops(const ModelSpec& m, const StageSpec& s, UnitKind kind) {
  const double N = static_cast<double>(s.micro_batch_size) * m.seq_len, C = m.n_embd, tp = s.tp_size;
  switch (kind) {
    case UnitKind::Attn: return 2 * N * C * 3 * C / tp + attention_core_flops(m, s) + 2 * N * C * C / tp;
    case UnitKind::Mlp: return 2 * 2 * N * C * 4 * C / tp;
    case UnitKind::Head: return lm_head_unit_flops(m, s);
    case UnitKind::Embed:
    case UnitKind::Input: return io_unit_flops(m, s);
  }
  STP_UNREACHABLE("bad UnitKind");
}

std::int64_t gpt2_final_norm_params(const ModelSpec& m) { return 2 * std::int64_t{m.n_embd}; }  // ln_f weight, bias

// Per layer 12C²/t + 7C/t + 6C (the sharded matrices and their sharded biases c_attn's and c_fc's,
// then the replicated LayerNorms and c_proj biases); wte (Vr rows per rank when vocab-parallel) on
// the first and on the last stage, once when they are one; wpe on the first; ln_f on the last.
// Movable: the layers' four matrices, and wte where only the head reads it (a last stage that is
// not also the first, whose embedding gathers rows of its f32 master).
StageParamCount gpt2_stage_params(const ModelSpec& m, const StageSpec& s) {
  const std::int64_t C = m.n_embd, T = m.seq_len, t = s.tp_size, layers = s.layer_end - s.layer_begin;
  const std::int64_t Vr = s.vocab_sharded() ? vocab_rows(m.vocab_size, s.tp_size) : m.vocab_size;
  const bool first = s.layer_begin == 0, last = s.layer_end == m.n_layer;
  StageParamCount n;
  n.all = layers * (12 * C * C / t + 7 * C / t + 6 * C);
  n.movable = layers * 12 * C * C / t;
  if (first || last) n.all += Vr * C;
  if (first) n.all += T * C;
  if (last) n.all += 2 * C;
  if (last && !first) n.movable += Vr * C;
  return n;
}

}  // namespace

const Architecture& gpt2_architecture() {
  static const Architecture a{
      .name = "gpt2",
      .tie_embeddings_default = true,
      .validate = &gpt2_validate,
      .param_table = &gpt2_param_table,
      .make_stage = &gpt2_make,
      .matmul_params = &gpt2_matmul_params,
      .attention_flops_per_token = &gpt2_attention_flops,
      .unit_flops = &gpt2_unit_flops,
      .final_norm_params = &gpt2_final_norm_params,
      .stage_params = &gpt2_stage_params,
  };
  return a;
}

}  // namespace stp
