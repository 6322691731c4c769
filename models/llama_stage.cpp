#include "models/llama_stage.h"

namespace stp {

namespace {

// The attention and MLP units (models/llama_units.h).
const BranchOps<LlamaDims, LlamaBranch> kLlamaAttn{
    .forward = &llama_attn_forward,
    .backward_input = &llama_attn_backward_input,
    .backward_weight = &llama_attn_backward_weight,
    .recompute = &llama_attn_recompute,
    .recomputed_records = &llama_attn_recomputed_records,
    .recompute_cost = &llama_attn_recompute_cost,
};
const BranchOps<LlamaDims, LlamaBranch> kLlamaMlp{
    .forward = &llama_mlp_forward,
    .backward_input = &llama_mlp_backward_input,
    .backward_weight = &llama_mlp_backward_weight,
    .recompute = &llama_mlp_recompute,
    .recomputed_records = &llama_mlp_recomputed_records,
    .recompute_cost = &llama_mlp_recompute_cost,
};

}  // namespace

LlamaStage::LlamaStage(const ModelSpec& config, const StageSpec& spec, Allocator& alloc)
    : BranchedStage(
          spec, config.n_layer,
          unit_dims(spec, config.seq_len, config.n_embd, config.vocab_size, config.precision, config.attention),
          llama_param_store(config, spec, alloc), alloc, kLlamaAttn, kLlamaMlp) {
  const int t = spec.tp_size;
  dims_.H = config.n_head / t;
  dims_.K = config.n_kv_head / t;
  dims_.D = config.n_embd / config.n_head;
  dims_.I = config.intermediate_size / t;
  dims_.eps = static_cast<float>(config.norm_eps);
  dims_.theta = config.rope_theta;
  head_weight_ = llama_head_weight(config);

  for (int u = 0; u < num_units(); ++u) {
    if (!is_branch(unit_kind(u))) continue;
    const std::string h = "model.layers." + std::to_string(unit_layer(u)) + ".";
    branch(u) =
        unit_kind(u) == UnitKind::Attn
            ? LlamaBranch{&params_.at(h + "input_layernorm.weight"), &params_.at(h + "self_attn.qkv_proj.weight"),
                          config.qkv_bias ? &params_.at(h + "self_attn.qkv_proj.bias") : nullptr,
                          &params_.at(h + "self_attn.o_proj.weight")}
            : LlamaBranch{&params_.at(h + "post_attention_layernorm.weight"),
                          &params_.at(h + "mlp.gate_up_proj.weight"), nullptr, &params_.at(h + "mlp.down_proj.weight")};
    const LlamaBranch& b = branch(u);
    std::vector<ParamInfo*> own{b.norm, b.in_w, b.out_w};
    if (b.in_b) own.push_back(b.in_b);
    set_unit_params(u, std::move(own), {b.norm});
  }
  if (is_first()) set_unit_params(0, {&params_.at("model.embed_tokens.weight")});
  if (is_last())
    set_unit_params(num_units() - 1, {&params_.at("model.norm.weight"), &params_.at(head_weight_)}, {},
                    {&params_.at("model.norm.weight")});
}

Tensor LlamaStage::embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) {
  return token_embedding_forward(dims_, params_.at("model.embed_tokens.weight"), nullptr, tokens, rec, cs);
}

void LlamaStage::embed_backward_weight(RecordSet& rec, CallScope& cs) {
  token_embedding_backward_weight(dims_, params_.at("model.embed_tokens.weight"), nullptr, rec, cs);
}

Tensor LlamaStage::finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) {
  return llama_norm_finalize(dims_, *branch(u).norm, dy, dnorm, rec, cs);
}

void LlamaStage::head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, const LossChunking& c,
                              RecordSet& rec, CallScope& cs) {
  llama_head_forward(dims_, params_.at("model.norm.weight"), params_.at(head_weight_), x, targets, loss, c, rec, cs);
}

Tensor LlamaStage::head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) {
  return llama_head_backward_input(dims_, params_.at("model.norm.weight"), params_.at(head_weight_), loss_scale, rec,
                                   cs);
}

void LlamaStage::head_backward_weight(RecordSet& rec, CallScope& cs) {
  lm_head_backward_weight(dims_, params_.at(head_weight_), rec, cs);
}

}  // namespace stp
