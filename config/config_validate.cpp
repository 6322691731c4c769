// Consistency checks of a Config that need nothing but the Config. Each message names the
// key(s), the value(s) and what to change.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "config/config.h"
#include "base/error.h"

namespace stp {
namespace {

template <typename T>
void check_at_least(const char* key, T value, T min) {
  STP_CHECK(value >= min, "config: ", key, " must be >= ", min, ", got ", value);
}

void validate_model(const Config& c) {
  check_at_least("model.n_layer", c.model.n_layer, 1);
  check_at_least("model.n_head", c.model.n_head, 1);
  check_at_least("model.n_embd", c.model.n_embd, 1);
  check_at_least("model.seq_len", c.model.seq_len, 1);
  check_at_least("model.vocab_size", c.model.vocab_size, 2);
  STP_CHECK(c.model.n_embd % c.model.n_head == 0, "config: model.n_embd (", c.model.n_embd,
            ") must be divisible by model.n_head (", c.model.n_head, ")");
  if (c.model.arch == "gpt2") {
    STP_CHECK(c.model.tie_embeddings != "false",
              "config: model.tie_embeddings: false is not supported by model.arch gpt2 (its LM head is the token "
              "embedding); remove the key or use model.arch llama");
  } else {
    const int kv = c.model.n_kv_head == 0 ? c.model.n_head : c.model.n_kv_head;
    check_at_least("model.n_kv_head", c.model.n_kv_head, 0);
    STP_CHECK(kv >= 1 && c.model.n_head % kv == 0, "config: model.n_kv_head (", kv, ") must divide model.n_head (",
              c.model.n_head, "): each key/value head serves a group of query heads");
    STP_CHECK(c.model.intermediate_size >= 1, "config: model.intermediate_size must be set (> 0) for model.arch ",
              c.model.arch, ", got ", c.model.intermediate_size);
    STP_CHECK(c.model.rope_theta > 0, "config: model.rope_theta must be > 0, got ", c.model.rope_theta);
    STP_CHECK(c.model.norm_eps > 0, "config: model.norm_eps must be > 0, got ", c.model.norm_eps);
  }
  const std::string& lc = c.model.loss_chunk_tokens;
  const bool positive = !lc.empty() && lc.size() <= 18 && lc.find_first_not_of("0123456789") == std::string::npos &&
                        lc.find_first_not_of('0') != std::string::npos;
  STP_CHECK(lc == "auto" || lc == "none" || positive,
            "config: model.loss_chunk_tokens must be auto, none or a "
            "positive integer (tokens per chunk of the loss head), got '",
            lc, "'");
  const std::string& ut = c.memory.unit_tiles;
  const bool tiles_int = !ut.empty() && ut.size() <= 9 && ut.find_first_not_of("0123456789") == std::string::npos &&
                         ut.find_first_not_of('0') != std::string::npos;
  STP_CHECK(
      ut == "auto" || (tiles_int && (c.train.micro_batch_size < 1 || c.train.micro_batch_size % std::stoll(ut) == 0)),
      "config: memory.unit_tiles must be auto or a positive integer that divides train.micro_batch_size (",
      c.train.micro_batch_size, "), got '", ut, "'");
  STP_CHECK(c.data.format != "text" || c.model.vocab_size >= 256, "config: model.vocab_size (", c.model.vocab_size,
            ") must be >= 256 with data.format text (every byte is a token)");
  STP_CHECK(c.data.format != "text" || c.data.tokenizer.empty(), "config: data.tokenizer '", c.data.tokenizer,
            "' is set but data.format text trains on bytes, which need no tokenizer; remove data.tokenizer, or "
            "tokenize the text with it (stp tokenize) and train on the token file (data.format llmc or tok32)");
}

void validate_train(const Config& c) {
  const TrainConfig& t = c.train;
  check_at_least("train.steps", t.steps, std::int64_t{1});
  check_at_least("train.micro_batch_size", t.micro_batch_size, 1);
  check_at_least("train.microbatches", t.microbatches, 1);
  check_at_least("train.warmup_steps", t.warmup_steps, std::int64_t{0});
  check_at_least("train.lr", t.lr, 0.0);
  check_at_least("train.min_lr", t.min_lr, 0.0);
  check_at_least("train.grad_clip", t.grad_clip, 0.0);
  check_at_least("train.eval_every", t.eval_every, std::int64_t{0});
  check_at_least("train.eval_batches", t.eval_batches, std::int64_t{1});
  check_at_least("train.max_skipped_steps", t.max_skipped_steps, std::int64_t{1});
  check_at_least("train.peak_flops", t.peak_flops, 0.0);
  STP_CHECK(c.data.val_mask_path.empty() || !c.data.val_path.empty(), "config: data.val_mask_path ('",
            c.data.val_mask_path, "') is the loss mask of data.val_path, which is null; set data.val_path or drop it");
  STP_CHECK(t.eval_every == 0 || !c.data.val_path.empty(), "config: train.eval_every (", t.eval_every,
            ") needs data.val_path (held-out tokens); set it, or train.eval_every: 0");
  STP_CHECK(t.lr_schedule != "cosine" || t.min_lr <= t.lr, "config: train.min_lr (", t.min_lr,
            ") must not exceed train.lr (", t.lr, ") with train.lr_schedule cosine");
  const OptimConfig& o = c.optim;
  STP_CHECK(o.beta1 >= 0 && o.beta1 < 1, "config: optim.beta1 must be in [0, 1), got ", o.beta1);
  STP_CHECK(o.beta2 >= 0 && o.beta2 < 1, "config: optim.beta2 must be in [0, 1), got ", o.beta2);
  STP_CHECK(o.eps > 0, "config: optim.eps must be > 0, got ", o.eps);
  check_at_least("optim.weight_decay", o.weight_decay, 0.0);
  const double limit = max_finite_lr(o);
  STP_CHECK(t.lr <= limit, "config: train.lr (", t.lr, ") must be at most ", limit,
            ", the largest learning rate whose AdamW update stays finite in float32 with optim.beta1 ", o.beta1,
            ", optim.beta2 ", o.beta2, " and optim.weight_decay ", o.weight_decay,
            " (docs/config.md, Non-finite steps and health metrics); lower train.lr");
}

void validate_parallel(const Config& c) {
  const ParallelConfig& p = c.parallel;
  check_at_least("parallel.dp", p.dp, 1);
  STP_CHECK(!p.dp_bucket || *p.dp_bucket >= sizeof(float),
            "config: parallel.dp_bucket must be at least 4 bytes (one gradient), or null for one bucket per chunk");
  check_at_least("parallel.tp", p.tp, 1);
  check_at_least("parallel.pp", p.pp, 1);
  check_at_least("parallel.cpu_threads", p.cpu_threads, 0);
  check_at_least("parallel.tp_link_bandwidth", p.tp_link_bandwidth, 0.0);
  STP_CHECK(c.model.n_head % p.tp == 0, "config: parallel.tp (", p.tp, ") must divide model.n_head (", c.model.n_head,
            "): each tensor-parallel rank holds whole heads");
  if (c.model.arch != "gpt2") {
    const int kv = c.model.n_kv_head == 0 ? c.model.n_head : c.model.n_kv_head;
    STP_CHECK(kv % p.tp == 0, "config: parallel.tp (", p.tp, ") must divide model.n_kv_head (", kv,
              "): each tensor-parallel rank holds whole key/value heads");
    STP_CHECK(c.model.intermediate_size % p.tp == 0, "config: parallel.tp (", p.tp,
              ") must divide model.intermediate_size (", c.model.intermediate_size, ")");
  }
}

void validate_memory_output(const Config& c) {
  STP_CHECK(!c.memory.device_budget || *c.memory.device_budget > 0,
            "config: memory.device_budget must be > 0 (or null for the device's capacity)");
  check_at_least("memory.link_bandwidth", c.memory.link_bandwidth, 0.0);
  check_at_least("memory.copy_engine_cpus", c.memory.copy_engine_cpus, 0);
  STP_CHECK(c.memory.copy_engine_cpus == 0 || c.parallel.backend == "cpu",
            "config: memory.copy_engine_cpus applies to the CPU backend only (GPUs have copy engines); set it to 0");
  STP_CHECK(c.memory.param_offload == "none" || c.memory.optimizer_offload != "none",
            "config: memory.param_offload = ", c.memory.param_offload,
            " streams the weights and gradients from pinned host memory, where the CPU AdamW updates them, but "
            "memory.optimizer_offload = none keeps the optimizer on the device; set memory.optimizer_offload: all "
            "(or auto), or memory.param_offload: none");
  check_at_least("output.log_every", c.output.log_every, std::int64_t{1});
  check_at_least("output.checkpoint_every", c.output.checkpoint_every, std::int64_t{0});
}

}  // namespace

// AdamW's step t (optim_kernels.h, adamw_step) from zero moments, in exact arithmetic:
//   m_t = (1 − β1) Σ_{k<t} β1^k g_{t−k},   v_t = (1 − β2) Σ_{k<t} β2^k g_{t−k}²,
//   p ← p · (1 − lr · wd) − lr · m̂ / (sqrt(v̂) + eps),   m̂ = m_t / (1 − β1^t), v̂ = v_t / (1 − β2^t).
// Write β1^k = (β1 / sqrt(β2))^k · sqrt(β2)^k. Cauchy–Schwarz over k, with γ = β1² / β2:
//   |m_t| <= (1 − β1) · sqrt(Σ_{k<t} γ^k) · sqrt(Σ_{k<t} β2^k g²)
//          = (1 − β1) · sqrt((1 − γ^t) / (1 − γ)) · sqrt(v_t / (1 − β2)),
// so, as eps > 0 only shrinks the ratio,
//   |m̂ / (sqrt(v̂) + eps)| <= (1 − β1) / (1 − β1^t) · sqrt((1 − γ^t)(1 − β2^t) / ((1 − γ)(1 − β2))).
// With a = β2^t, b = γ^t (ab = β1^2t): (1 − a)(1 − b) <= (1 − sqrt(ab))² = (1 − β1^t)², since
// a + b >= 2 sqrt(ab). So for every t the ratio is at most
//   R = (1 − β1) / sqrt((1 − β2)(1 − γ)),
// reached as t grows by the gradients |g_{t−k}| ∝ (β1 / β2)^k (R = 1 at β1 = 0, β2 = 0). It
// needs γ < 1, i.e. β1 < sqrt(β2): otherwise an old large gradient leaves m decaying slower than
// sqrt(v) and the ratio has no bound but the step count.
double adamw_update_bound(const OptimConfig& o) {
  if (o.beta1 * o.beta1 >= o.beta2 && o.beta1 > 0) return 0;
  const double gamma = o.beta1 > 0 ? o.beta1 * o.beta1 / o.beta2 : 0.0;
  return (1 - o.beta1) / std::sqrt((1 - o.beta2) * (1 - gamma));
}

// The f32 values of a step must be finite whatever the gradients: the step size lr / (1 − β1^t)
// (largest at t = 1), the decay factor 1 − lr · wd, and the update lr · |m̂ / (sqrt(v̂) + eps)| <=
// lr · R. A factor 2 to spare covers the rounding of the few f32 operations between them. What
// the parameters themselves then do (p · (1 − lr · wd) near FLT_MAX, R absent for β1 >= sqrt(β2))
// depends on their values, not on lr alone: the non-finite guard and the check of every state
// called good catch it (docs/config.md, Non-finite steps and health metrics).
double max_finite_lr(const OptimConfig& o) {
  const double worst = std::max({1 / (1 - o.beta1), adamw_update_bound(o), o.weight_decay});
  return static_cast<double>(FLT_MAX) / (2 * worst);
}

void validate_config(const Config& cfg) {
  validate_model(cfg);
  validate_train(cfg);
  validate_parallel(cfg);
  validate_memory_output(cfg);
}

}  // namespace stp
