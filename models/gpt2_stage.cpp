#include "models/gpt2_stage.h"

namespace stp {

namespace {

// The attention and MLP units (models/gpt2_units.h).
const BranchOps<GPT2Dims, GPT2Branch> kGPT2Attn{
    .forward = &gpt2_attn_forward,
    .backward_input = &gpt2_attn_backward_input,
    .backward_weight = &gpt2_attn_backward_weight,
    .recompute = &gpt2_attn_recompute,
    .recomputed_records = &gpt2_attn_recomputed_records,
    .recompute_cost = &gpt2_attn_recompute_cost,
};
const BranchOps<GPT2Dims, GPT2Branch> kGPT2Mlp{
    .forward = &gpt2_mlp_forward,
    .backward_input = &gpt2_mlp_backward_input,
    .backward_weight = &gpt2_mlp_backward_weight,
    .recompute = &gpt2_mlp_recompute,
    .recomputed_records = &gpt2_mlp_recomputed_records,
    .recompute_cost = &gpt2_mlp_recompute_cost,
};

}  // namespace

GPT2Stage::GPT2Stage(const ModelSpec& config, const StageSpec& spec, Allocator& alloc)
    : BranchedStage(
          spec, config.n_layer,
          unit_dims(spec, config.seq_len, config.n_embd, config.vocab_size, config.precision, config.attention),
          gpt2_param_store(config, spec, alloc), alloc, kGPT2Attn, kGPT2Mlp) {
  const int t = spec.tp_size;
  dims_.H = config.n_head / t;
  dims_.D = config.n_embd / config.n_head;
  dims_.Cl = dims_.H * dims_.D;
  dims_.Fl = 4 * dims_.C / t;

  for (int u = 0; u < num_units(); ++u) {
    if (!is_branch(unit_kind(u))) continue;
    const std::string h = "h." + std::to_string(unit_layer(u)) + ".";
    const bool attn = unit_kind(u) == UnitKind::Attn;
    const std::string ln = attn ? "ln_1" : "ln_2", in = attn ? "attn.c_attn" : "mlp.c_fc",
                      out = attn ? "attn.c_proj" : "mlp.c_proj";
    GPT2Branch& b = branch(u);
    b.ln = {&params_.at(h + ln + ".weight"), &params_.at(h + ln + ".bias")};
    b.in_w = &params_.at(h + in + ".weight");
    b.in_b = &params_.at(h + in + ".bias");
    b.out_w = &params_.at(h + out + ".weight");
    b.out_b = &params_.at(h + out + ".bias");
    set_unit_params(u, {b.ln.w, b.ln.b, b.in_w, b.in_b, b.out_w, b.out_b}, {b.ln.w, b.ln.b}, {b.out_b});
  }
  if (is_first()) set_unit_params(0, {&params_.at("wte.weight"), &params_.at("wpe.weight")});
  if (is_last())
    set_unit_params(num_units() - 1, {ln_f().w, ln_f().b, &params_.at("wte.weight")}, {}, {ln_f().w, ln_f().b});
}

Tensor GPT2Stage::embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) {
  return token_embedding_forward(dims_, params_.at("wte.weight"), &params_.at("wpe.weight"), tokens, rec, cs);
}

void GPT2Stage::embed_backward_weight(RecordSet& rec, CallScope& cs) {
  token_embedding_backward_weight(dims_, params_.at("wte.weight"), &params_.at("wpe.weight"), rec, cs);
}

Tensor GPT2Stage::finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) {
  return gpt2_norm_finalize(dims_, branch(u).ln, dy, dnorm, rec, cs);
}

void GPT2Stage::head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, const LossChunking& c,
                             RecordSet& rec, CallScope& cs) {
  gpt2_head_forward(dims_, ln_f(), params_.at("wte.weight"), x, targets, loss, c, rec, cs);
}

Tensor GPT2Stage::head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) {
  return gpt2_head_backward_input(dims_, ln_f(), params_.at("wte.weight"), loss_scale, rec, cs);
}

void GPT2Stage::head_backward_weight(RecordSet& rec, CallScope& cs) {
  lm_head_backward_weight(dims_, params_.at("wte.weight"), rec, cs);
}

}  // namespace stp
