#include "models/llama_params.h"

#include "base/error.h"
#include "models/unit_common.h"

namespace stp {
namespace {

using i64 = std::int64_t;

bool ends_with(const std::string& s, std::string_view suffix) { return std::string_view(s).ends_with(suffix); }

}  // namespace

void llama_validate(const ModelSpec& m, const StageSpec& s) {
  STP_CHECK(m.n_layer >= 1 && m.n_head >= 1 && m.n_embd >= 1 && m.vocab_size >= 1 && m.seq_len >= 1 &&
                m.intermediate_size >= 1,
            "model: n_layer, n_head, n_embd, intermediate_size, vocab_size and seq_len must be positive");
  STP_CHECK(m.n_embd % m.n_head == 0, "model.n_embd (", m.n_embd, ") must be a multiple of model.n_head (", m.n_head,
            ")");
  STP_CHECK((m.n_embd / m.n_head) % 2 == 0, "model: the head dimension n_embd / n_head (", m.n_embd / m.n_head,
            ") must be even for rotary positions");
  STP_CHECK(m.n_kv_head >= 1 && m.n_head % m.n_kv_head == 0, "model.n_kv_head (", m.n_kv_head,
            ") must divide model.n_head (", m.n_head, ")");
  STP_CHECK(s.tp_size >= 1 && m.n_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_head (",
            m.n_head, ")");
  STP_CHECK(m.n_kv_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_kv_head (", m.n_kv_head,
            "): each tensor-parallel rank holds whole key/value heads");
  STP_CHECK(m.intermediate_size % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.intermediate_size (",
            m.intermediate_size, ")");
  STP_CHECK(m.rope_theta > 0 && m.norm_eps > 0, "model.rope_theta and model.norm_eps must be positive");
  validate_split_and_attention(m, s);
}

std::string llama_head_weight(const ModelSpec& m) {
  return m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

std::vector<ParamInfo> llama_param_table(const ModelSpec& m, const StageSpec& s) {
  llama_validate(m, s);
  const i64 C = m.n_embd, V = m.vocab_size, D = m.n_embd / m.n_head, I = m.intermediate_size;
  const i64 QW = m.n_head * D, KW = m.n_kv_head * D;
  const int r = s.tp_rank, t = s.tp_size;
  const bool first = s.layer_begin == 0, last = s.layer_end == m.n_layer;
  std::vector<ParamInfo> out;
  auto vec = [&](const std::string& n, i64 len) {
    out.push_back(make_param(n, {len}, replicated_layout(1, len), true));
  };
  if (first || (last && m.tie_embeddings)) {
    out.push_back(make_param("model.embed_tokens.weight", {V, C}, vocab_layout(V, C, s), !s.vocab_sharded()));
    out.back().tied = m.tie_embeddings && !(first && last);
    out.back().vocab = true;
  }
  for (int i = s.layer_begin; i < s.layer_end; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    vec(h + "input_layernorm.weight", C);
    out.push_back(
        make_param(h + "self_attn.qkv_proj.weight", {C, QW + 2 * KW}, column_layout(C, {QW, KW, KW}, r, t), t == 1));
    if (m.qkv_bias)
      out.push_back(
          make_param(h + "self_attn.qkv_proj.bias", {QW + 2 * KW}, column_layout(1, {QW, KW, KW}, r, t), t == 1));
    out.push_back(make_param(h + "self_attn.o_proj.weight", {QW, C}, row_layout(QW, C, r, t), t == 1));
    vec(h + "post_attention_layernorm.weight", C);
    out.push_back(make_param(h + "mlp.gate_up_proj.weight", {C, 2 * I}, column_layout(C, {I, I}, r, t), t == 1));
    out.push_back(make_param(h + "mlp.down_proj.weight", {I, C}, row_layout(I, C, r, t), t == 1));
  }
  if (last) {
    vec("model.norm.weight", C);
    if (!m.tie_embeddings) {
      out.push_back(make_param("lm_head.weight", {V, C}, vocab_layout(V, C, s), !s.vocab_sharded()));
      out.back().vocab = true;
    }
  }
  return out;
}

ParamStore llama_param_store(const ModelSpec& model, const StageSpec& spec, Allocator& alloc) {
  // bf16: the weights GEMMs multiply by get bf16 copies; the embedding only where the tied head
  // uses it (the embedding gathers rows of the f32 master).
  const bool has_head = spec.layer_end == model.n_layer;
  auto gemm_weight = [has_head, head = llama_head_weight(model)](const std::string& n) {
    return ends_with(n, "qkv_proj.weight") || ends_with(n, "o_proj.weight") || ends_with(n, "gate_up_proj.weight") ||
           ends_with(n, "down_proj.weight") || (n == head && has_head);
  };
  // HF's init: normal(0, 0.02) weights, biases 0, norms 1.
  auto init = [](const std::string& name) {
    if (ends_with(name, "norm.weight")) return ParamInit{false, 1.0};
    if (ends_with(name, ".bias")) return ParamInit{false, 0.0};
    return ParamInit{true, 0.02};
  };
  // The embedding gather reads the embedding's f32 master on the device.
  auto reads_master = [first = spec.layer_begin == 0](const std::string& n) {
    return first && n == "model.embed_tokens.weight";
  };
  return ParamStore(llama_param_table(model, spec), model.precision, gemm_weight, init, alloc, spec.host_masters,
                    reads_master, spec.shard_masters, spec.streamed);
}

}  // namespace stp
