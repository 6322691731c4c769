// The math of a Llama-family block's braidable units on one TP rank: F, B and W of the
// embedding, attention, MLP and head units. Every pass enqueues kernels (core/kernels/) on one
// stream; what a later pass needs goes into the unit's RecordSet and nowhere else.
//
//   embed  F: x0 = embed_tokens[tokens] (token_embedding_forward, models/unit_common.h)
//   attn   F: RMSNorm -> qkv_proj (column, + bias) -> RoPE on q, k -> causal GQA attention
//              -> o_proj (row) -> partial sum
//   mlp    F: RMSNorm -> gate_up_proj (column) -> silu(gate) * up -> down_proj (row) -> partial sum
//   head   F: norm -> logits = x W^T (W = lm_head, or embed_tokens when tied) -> cross-entropy
//
// The cut at the all-reduce and the norm's backward after it are GPT-2's (models/gpt2_units.h,
// Notes [Residual folded into rank 0's partial] and [LayerNorm after the all-reduce]) with RMSNorm
// in place of LayerNorm: records "ln.x" and "ln.rstd" of unit u are read by B(u-1), which runs
// the norm backward on the all-reduced gradient (llama_norm_finalize). o_proj and down_proj have
// no bias, so rank 0 folds only the residual in.
//
// Records (N = B*T; act = the activation type): attn "ln.x" (N,C) f32, "ln.rstd" (N,) f32,
// "ln.out" (N,C), "qkv" (N,(H+2K)D) after RoPE, then "att" (naive) or "lse" (fused), "y" (N,HD);
// B leaves "dy" (N,C) and "dqkv" (N,(H+2K)D) before RoPE for W. mlp "ln.*", "h" (N,2I) [gate|up],
// "act" (N,I); B leaves "dy" and "dh" (N,2I). Local sizes H, K, I are per TP rank.
//
// Recompute (models/stage.h):
//   attn  Selective: keeps ln.x, ln.rstd, qkv           (drops ln.out, att|lse, y)
//         Full:      keeps ln.x                          (drops ln.rstd, ln.out, qkv, att|lse, y)
//   mlp   Selective: keeps ln.x, ln.rstd, h             (drops ln.out, act)
//         Full:      keeps ln.x                          (drops ln.rstd, ln.out, h, act)
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "memory/activation.h"
#include "models/model_spec.h"
#include "models/stage.h"
#include "models/unit_common.h"

namespace stp {

// Sizes one rank works with: H local query heads and K local key/value heads of D; QW = H*D,
// KW = K*D, QKV = QW + 2 KW; I local MLP width.
struct LlamaDims : UnitDims {
  std::int64_t H = 0, K = 0, D = 0, I = 0;
  float eps = 1e-5f;
  double theta = 10000.0;
  std::int64_t QW() const { return H * D; }
  std::int64_t KW() const { return K * D; }
  std::int64_t QKV() const { return QW() + 2 * KW(); }
};

struct LlamaBranch {
  ParamInfo* norm = nullptr;   // RMSNorm weight (replicated)
  ParamInfo* in_w = nullptr;   // qkv_proj / gate_up_proj (column-parallel shard)
  ParamInfo* in_b = nullptr;   // qkv_proj bias or nullptr
  ParamInfo* out_w = nullptr;  // o_proj / down_proj (row-parallel shard)
};

// Stage::prepare_kernels of a Llama stage: the fused attention's library plans (no-op under naive).
void llama_prepare_kernels(const LlamaDims& d, Stream& s);

Tensor llama_attn_forward(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs);
Tensor llama_attn_backward_input(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy, RecordSet& rec,
                                 CallScope& cs);
void llama_attn_backward_weight(const LlamaDims& d, const LlamaBranch& p, RecordSet& rec, CallScope& cs);

Tensor llama_mlp_forward(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs);
Tensor llama_mlp_backward_input(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy, RecordSet& rec,
                                CallScope& cs);
void llama_mlp_backward_weight(const LlamaDims& d, const LlamaBranch& p, RecordSet& rec, CallScope& cs);

// The RMSNorm backward of a TP unit after its all-reduce: dx = dy + RMSNorm^T(dln); accumulates
// the norm weight's gradient and releases the unit's BPrev records.
Tensor llama_norm_finalize(const LlamaDims& d, ParamInfo& norm, const Tensor& dy, const Tensor& dln, RecordSet& rec,
                           CallScope& cs);

std::vector<RecomputedRecord> llama_attn_recomputed_records(const LlamaDims& d, Recompute r);
std::vector<RecomputedRecord> llama_mlp_recomputed_records(const LlamaDims& d, Recompute r);
double llama_attn_recompute_cost(const LlamaDims& d, Recompute r);
double llama_mlp_recompute_cost(const LlamaDims& d, Recompute r);
void llama_attn_recompute(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs);
void llama_mlp_recompute(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs);

// head_w: lm_head.weight, or model.embed_tokens.weight when tied. Writes the mean loss into `loss`.
// Chunked (c.chunked(), models/unit_common.h LossChunking): the LM head runs through
// lm_head_forward_chunked and, with gradients, the norm's backward follows in F, which keeps only
// "dx" for B (every other record released).
void llama_head_forward(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, const Tensor& x, const Tensor& targets,
                        const Tensor& loss, const LossChunking& c, RecordSet& rec, CallScope& cs);
// Returns dx (chunked: the one F kept), the gradient w.r.t. the head's input: whole on every rank with the replicated
// vocabulary, this rank's partial for the caller's all-reduce when vocab-parallel
// (head_norm_grad_partials, models/unit_common.h).
Tensor llama_head_backward_input(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, float loss_scale,
                                 RecordSet& rec, CallScope& cs);
// W: lm_head_backward_weight (models/unit_common.h) with head_w.

}  // namespace stp
