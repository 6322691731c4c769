#include "models/gpt2_params.h"

#include <cmath>

#include "base/error.h"
#include "models/unit_common.h"

namespace stp {
namespace {

using i64 = std::int64_t;

void add_layer(std::vector<ParamInfo>& out, int i, i64 C, int r, int t) {
  std::string h = "h." + std::to_string(i) + ".";
  auto vec = [&](const std::string& n, i64 len) {
    out.push_back(make_param(h + n, {len}, replicated_layout(1, len), true));
  };
  vec("ln_1.weight", C);
  vec("ln_1.bias", C);
  out.push_back(make_param(h + "attn.c_attn.weight", {C, 3 * C}, column_layout(C, {C, C, C}, r, t), t == 1));
  out.push_back(make_param(h + "attn.c_attn.bias", {3 * C}, column_layout(1, {C, C, C}, r, t), t == 1));
  out.push_back(make_param(h + "attn.c_proj.weight", {C, C}, row_layout(C, C, r, t), t == 1));
  vec("attn.c_proj.bias", C);
  vec("ln_2.weight", C);
  vec("ln_2.bias", C);
  out.push_back(make_param(h + "mlp.c_fc.weight", {C, 4 * C}, column_layout(C, {4 * C}, r, t), t == 1));
  out.push_back(make_param(h + "mlp.c_fc.bias", {4 * C}, column_layout(1, {4 * C}, r, t), t == 1));
  out.push_back(make_param(h + "mlp.c_proj.weight", {4 * C, C}, row_layout(4 * C, C, r, t), t == 1));
  vec("mlp.c_proj.bias", C);
}

}  // namespace

void gpt2_validate(const ModelSpec& c, const StageSpec& s) {
  STP_CHECK(c.tie_embeddings,
            "model.tie_embeddings: false is not supported by model.arch gpt2 (its head is the "
            "token embedding)");
  STP_CHECK(c.n_layer >= 1 && c.n_head >= 1 && c.n_embd >= 1 && c.vocab_size >= 1 && c.seq_len >= 1,
            "model: n_layer, n_head, n_embd, vocab_size and seq_len must be positive");
  STP_CHECK(c.n_embd % c.n_head == 0, "model.n_embd (", c.n_embd, ") must be a multiple of model.n_head (", c.n_head,
            ")");
  STP_CHECK(s.tp_size >= 1 && c.n_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_head (",
            c.n_head, ")");
  validate_split_and_attention(c, s);
}

std::vector<ParamInfo> gpt2_param_table(const ModelSpec& c, const StageSpec& s) {
  gpt2_validate(c, s);
  const i64 C = c.n_embd;
  const bool first = s.layer_begin == 0, last = s.layer_end == c.n_layer;
  std::vector<ParamInfo> out;
  if (first || last) {
    out.push_back(make_param("wte.weight", {c.vocab_size, C}, vocab_layout(c.vocab_size, C, s), !s.vocab_sharded()));
    out.back().tied = !(first && last);
    out.back().vocab = true;
  }
  if (first) out.push_back(make_param("wpe.weight", {c.seq_len, C}, replicated_layout(c.seq_len, C), true));
  for (int i = s.layer_begin; i < s.layer_end; ++i) add_layer(out, i, C, s.tp_rank, s.tp_size);
  if (last) {
    out.push_back(make_param("ln_f.weight", {C}, replicated_layout(1, C), true));
    out.push_back(make_param("ln_f.bias", {C}, replicated_layout(1, C), true));
  }
  return out;
}

ParamStore gpt2_param_store(const ModelSpec& config, const StageSpec& spec, Allocator& alloc) {
  // bf16: the weights GEMMs multiply by get bf16 copies; wte only where the LM head uses it (the
  // embedding gathers rows of the f32 master).
  const bool has_head = spec.layer_end == config.n_layer;
  auto gemm_weight = [has_head](const std::string& n) {
    auto ends = [&](std::string_view suffix) { return std::string_view(n).ends_with(suffix); };
    return ends("c_attn.weight") || ends("c_proj.weight") || ends("c_fc.weight") || (n == "wte.weight" && has_head);
  };
  // GPT-2's init: normal(0, 0.02); c_proj weights 0.02/sqrt(2*n_layer); biases 0; LayerNorms 1/0.
  auto init = [n_layer = config.n_layer](const std::string& name) {
    const bool is_ln = name.find("ln_") != std::string::npos;
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_ln || is_bias) return ParamInit{false, is_ln && !is_bias ? 1.0 : 0.0};
    const bool proj = name.find("c_proj.weight") != std::string::npos;
    return ParamInit{true, proj ? 0.02 / std::sqrt(2.0 * n_layer) : 0.02};
  };
  // The embedding gather reads wte's f32 master on the device.
  auto reads_master = [first = spec.layer_begin == 0](const std::string& n) { return first && n == "wte.weight"; };
  return ParamStore(gpt2_param_table(config, spec), config.precision, gemm_weight, init, alloc, spec.host_masters,
                    reads_master, spec.shard_masters, spec.streamed);
}

}  // namespace stp
