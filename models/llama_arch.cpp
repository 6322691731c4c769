// Llama's registry entry (models/registry.h) and its arithmetic, from the parameter table of
// models/llama_params.h and the units of models/llama_units.h. C = n_embd, L = n_layer, V =
// vocab_size, T = seq_len, H = n_head, K = n_kv_head, D = C / H, I = intermediate_size; per layer:
// input_layernorm, qkv_proj [C, (H+2K)D] (+ bias with qkv_bias), o_proj [HD, C],
// post_attention_layernorm, gate_up_proj [C, 2I], down_proj [I, C].
#include <cstdint>
#include <memory>

#include "base/error.h"
#include "models/llama_params.h"
#include "models/llama_stage.h"
#include "models/registry.h"
#include "models/unit_common.h"

namespace stp {
namespace {

std::unique_ptr<Stage> llama_make(const ModelSpec& m, const StageSpec& s, Allocator& alloc) {
  llama_validate(m, s);
  return std::make_unique<LlamaStage>(m, s, alloc);
}

// Every parameter but an untied embed_tokens (a lookup); the head's weight once, tied or not.
double llama_matmul_params(const ModelSpec& m) {
  const double C = m.n_embd, L = m.n_layer, V = m.vocab_size;
  const double kv = static_cast<double>(m.n_kv_head) * (m.n_embd / m.n_head);  // k and v widths
  const double I = m.intermediate_size;
  const double attn = C * C + 2 * C * kv + C * C + (m.qkv_bias ? C + 2 * kv : 0);  // q, k, v (+ biases), o
  const double block = 2 * C + attn + 3 * C * I;  // two RMSNorms, attention, gate / up / down
  // + the final norm + the head (tied or not; the input lookup is free)
  return L * block + C + V * C;
}

// Scores q k^T and weighted values p v: 2 · 2 · T · HD per layer, HD = C (grouped k/v heads are
// shared, not fewer queries).
double llama_attention_flops(const ModelSpec& m) { return 4.0 * m.n_layer * m.n_embd * m.seq_len; }

double llama_unit_flops(const ModelSpec& m, const StageSpec& s, UnitKind kind) {
  const double N = static_cast<double>(s.micro_batch_size) * m.seq_len, C = m.n_embd, tp = s.tp_size;
  switch (kind) {
    case UnitKind::Attn: {  // grouped k/v heads: qkv_proj is C + 2·C·K/H wide
      const double kv = m.n_kv_head;
      const double qkv = C + 2 * C * kv / m.n_head;
      return 2 * N * C * qkv / tp + attention_core_flops(m, s) + 2 * N * C * C / tp;
    }
    case UnitKind::Mlp: return 3 * 2 * N * C * m.intermediate_size / tp;  // gate, up, down
    case UnitKind::Head: return lm_head_unit_flops(m, s);
    case UnitKind::Embed:
    case UnitKind::Input: return io_unit_flops(m, s);
  }
  STP_UNREACHABLE("bad UnitKind");
}

std::int64_t llama_final_norm_params(const ModelSpec& m) { return m.n_embd; }  // model.norm weight

// Per layer the two RMSNorms (replicated) and this rank's shards of qkv_proj (and its bias),
// o_proj, gate_up_proj and down_proj; embed_tokens (Vr rows per rank when vocab-parallel) on the
// first stage, and on the last too when tied (once when they are one); on the last stage the final
// norm and, untied, lm_head. Movable: the layers' four matrices, and the head's weight where only
// the head reads it (lm_head, or a tied embed_tokens on a last stage that is not also the first).
StageParamCount llama_stage_params(const ModelSpec& m, const StageSpec& s) {
  const std::int64_t C = m.n_embd, D = m.n_embd / m.n_head, I = m.intermediate_size, t = s.tp_size;
  const std::int64_t QKV = (m.n_head + 2 * std::int64_t{m.n_kv_head}) * D, QW = m.n_head * D;
  const std::int64_t layers = s.layer_end - s.layer_begin;
  const std::int64_t Vr = s.vocab_sharded() ? vocab_rows(m.vocab_size, s.tp_size) : m.vocab_size;
  const bool first = s.layer_begin == 0, last = s.layer_end == m.n_layer, tied = m.tie_embeddings;
  const std::int64_t matrices = C * QKV / t + QW * C / t + C * 2 * I / t + I * C / t;
  StageParamCount n;
  n.all = layers * (matrices + 2 * C + (m.qkv_bias ? QKV / t : 0));
  n.movable = layers * matrices;
  if (first || (last && tied)) n.all += Vr * C;
  if (last) n.all += C + (tied ? 0 : Vr * C);
  if (last && !(tied && first)) n.movable += Vr * C;
  return n;
}

}  // namespace

const Architecture& llama_architecture() {
  static const Architecture a{
      .name = "llama",
      .tie_embeddings_default = false,
      .validate = &llama_validate,
      .param_table = &llama_param_table,
      .make_stage = &llama_make,
      .matmul_params = &llama_matmul_params,
      .attention_flops_per_token = &llama_attention_flops,
      .unit_flops = &llama_unit_flops,
      .final_norm_params = &llama_final_norm_params,
      .stage_params = &llama_stage_params,
  };
  return a;
}

}  // namespace stp
