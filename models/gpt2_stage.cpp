#include "models/gpt2_stage.h"

namespace stp {

GPT2Stage::GPT2Stage(const GPT2Config& config, const GPT2StageSpec& spec, Allocator& alloc)
    : StageBase(spec, config.n_layer, config.seq_len, config.n_embd, gpt2_param_store(config, spec, alloc), alloc) {
  const int t = spec.tp_size;
  dims_.B = spec.micro_batch_size;
  dims_.T = config.seq_len;
  dims_.C = config.n_embd;
  dims_.V = config.vocab_size;
  dims_.H = config.n_head / t;
  dims_.D = config.n_embd / config.n_head;
  dims_.Cl = dims_.H * dims_.D;
  dims_.Fl = 4 * dims_.C / t;
  dims_.tp_rank = spec.tp_rank;
  dims_.tp_size = t;
  dims_.act = config.precision;
  dims_.attention = config.attention;

  branches_.resize(static_cast<std::size_t>(num_units()));
  for (int u = 0; u < num_units(); ++u) {
    if (!is_branch(unit_kind(u))) continue;
    const std::string h = "h." + std::to_string(unit_layer(u)) + ".";
    const bool attn = is_attn(u);
    const std::string ln = attn ? "ln_1" : "ln_2", in = attn ? "attn.c_attn" : "mlp.c_fc",
                      out = attn ? "attn.c_proj" : "mlp.c_proj";
    BranchParams& b = branches_[static_cast<std::size_t>(u)];
    b.ln = {&params_.at(h + ln + ".weight"), &params_.at(h + ln + ".bias")};
    b.in_w = &params_.at(h + in + ".weight");
    b.in_b = &params_.at(h + in + ".bias");
    b.out_w = &params_.at(h + out + ".weight");
    b.out_b = &params_.at(h + out + ".bias");
  }
}

Tensor GPT2Stage::embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) {
  return token_embedding_forward(dims_, params_.at("wte.weight"), &params_.at("wpe.weight"), tokens, rec, cs);
}

void GPT2Stage::embed_backward_weight(RecordSet& rec, CallScope& cs) {
  token_embedding_backward_weight(dims_, params_.at("wte.weight"), &params_.at("wpe.weight"), rec, cs);
}

Tensor GPT2Stage::branch_forward(int u, const Tensor& x, RecordSet& rec, CallScope& cs) {
  return is_attn(u) ? attn_forward(dims_, branch(u), x, rec, cs) : mlp_forward(dims_, branch(u), x, rec, cs);
}

Tensor GPT2Stage::branch_backward_input(int u, const Tensor& dy, RecordSet& rec, CallScope& cs) {
  return is_attn(u) ? attn_backward_input(dims_, branch(u), dy, rec, cs)
                    : mlp_backward_input(dims_, branch(u), dy, rec, cs);
}

void GPT2Stage::branch_backward_weight(int u, RecordSet& rec, CallScope& cs) {
  if (is_attn(u)) attn_backward_weight(dims_, branch(u), rec, cs);
  else mlp_backward_weight(dims_, branch(u), rec, cs);
}

Tensor GPT2Stage::finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) {
  return layernorm_finalize(dims_, branch(u).ln, dy, dnorm, rec, cs);
}

std::vector<RecomputedRecord> GPT2Stage::branch_recomputed_records(int u, Recompute r) const {
  return is_attn(u) ? attn_recomputed_records(dims_, r) : mlp_recomputed_records(dims_, r);
}

double GPT2Stage::branch_recompute_cost(int u, Recompute r) const {
  return is_attn(u) ? attn_recompute_cost(dims_, r) : mlp_recompute_cost(dims_, r);
}

void GPT2Stage::branch_recompute(int u, Recompute r, RecordSet& rec, CallScope& cs) {
  if (is_attn(u)) attn_recompute(dims_, branch(u), r, rec, cs);
  else mlp_recompute(dims_, branch(u), r, rec, cs);
}

void GPT2Stage::head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, RecordSet& rec,
                             CallScope& cs) {
  stp::head_forward(dims_, ln_f(), params_.at("wte.weight"), x, targets, loss, rec, cs);
}

Tensor GPT2Stage::head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) {
  return stp::head_backward_input(dims_, ln_f(), params_.at("wte.weight"), loss_scale, rec, cs);
}

void GPT2Stage::head_backward_weight(RecordSet& rec, CallScope& cs) {
  lm_head_backward_weight(dims_, params_.at("wte.weight"), rec, cs);
}

}  // namespace stp
