// The math of GPT-2's braidable units on one TP rank: F (forward), B (input gradient) and W
// (weight gradient) of the embedding, attention, MLP and head units. Every pass enqueues kernels
// (core/kernels/nn_kernels.h) on one stream; what a later pass needs goes into the unit's
// RecordSet (memory/activation.h) and nowhere else.
//
// Units of a stage, in forward order (models/gpt2_stage.h numbers them):
//   embed  F: x0 = wte[tokens] + wpe (token_embedding_forward, models/unit_common.h)
//   attn   F: LN1 -> c_attn (column) -> causal attention -> c_proj (row) -> partial sum
//   mlp    F: LN2 -> c_fc (column) -> GELU -> c_proj (row) -> partial sum
//   head   F: ln_f -> logits = x wte^T -> cross-entropy   (replicated, or vocab-parallel: models/unit_common.h)
//
// Note [Residual folded into rank 0's partial]
//   A transformer sub-layer is x' = x + AR(P), P = this rank's row-parallel partial output. Rank 0
//   adds the residual x and the (replicated) c_proj bias into its partial before the all-reduce,
//   the other ranks contribute only their GEMM product, so the all-reduced tensor *is* the next
//   residual stream x'. Each unit then maps one full tensor to one tensor, and a stage hands over
//   exactly one (B,T,C) tensor. With tp = 1 the unit's output is x' directly.
//
// Note [LayerNorm after the all-reduce]
//   B of a TP unit runs c_proj^T, the branch and c_attn^T/c_fc^T, ending with g_part, this rank's
//   partial gradient w.r.t. the LayerNorm *output* — the tensor the caller all-reduces (AR_B).
//   LayerNorm's backward is nonlinear in its statistics and its weight gradients need the full
//   gradient, so it must run after the all-reduce: at the start of B of the previous unit
//   ("finalize"):
//       dx = dy + LN^T(AR(g_part))     dw_ln += sum(AR(g_part) * xhat), db_ln += sum(AR(g_part))
//   where dy (the gradient w.r.t. the unit's output, full on every rank) is the residual gradient:
//   added after the branch all-reduce and never reduced (docs/schedules.md, STP op lists, Pitfalls). Hence the
//   LayerNorm input and statistics of unit u are records read by B(u-1) (RecordReader::BPrev),
//   and LayerNorm weight gradients are computed in B, not W (they are tiny). So is the gradient of
//   c_proj's bias: a column sum of the f32 dy (with bf16 precision, W only has dy's bf16 copy).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/activation.h"
#include "models/model_spec.h"
#include "models/stage.h"
#include "models/unit_common.h"

namespace stp {

// Sizes one rank works with. N = B*T rows; H local heads of D; Cl = H*D; Fl = 4C/tp.
// act: the storage type of the activations between GEMMs (docs/model.md, "Precision"). With bf16,
// the LayerNorm outputs, q/k/v, attention probabilities and outputs, MLP hidden states, logits and
// the gradients W reads are bf16, and GEMMs use the bf16 copies of the weights
// (ParamInfo::compute). The residual stream, everything all-reduced or sent between stages,
// LayerNorm statistics, losses and parameter gradients stay f32.
struct GPT2Dims : UnitDims {
  std::int64_t H = 0, D = 0, Cl = 0, Fl = 0;
};

struct GPT2LayerNorm {
  ParamInfo* w = nullptr;
  ParamInfo* b = nullptr;
};

// Attention and MLP units share a shape: LN -> column-parallel -> op -> row-parallel.
struct GPT2Branch {
  GPT2LayerNorm ln;
  ParamInfo* in_w = nullptr;  // c_attn / c_fc (column-parallel shard)
  ParamInfo* in_b = nullptr;
  ParamInfo* out_w = nullptr;  // c_proj (row-parallel shard)
  ParamInfo* out_b = nullptr;  // replicated, added by rank 0
};

// Stage::prepare_kernels of a GPT-2 stage: the fused attention's library plans (no-op under naive).
void gpt2_prepare_kernels(const GPT2Dims& d, Stream& s);

// ---- attention / MLP units (records named "ln.x", "ln.mean", "ln.rstd", "ln.out", ...) ---------
// F returns this rank's partial of the next residual stream; B returns g_part (see the notes).
Tensor gpt2_attn_forward(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs);
Tensor gpt2_attn_backward_input(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy, RecordSet& rec,
                                CallScope& cs);
void gpt2_attn_backward_weight(const GPT2Dims& d, const GPT2Branch& p, RecordSet& rec, CallScope& cs);

Tensor gpt2_mlp_forward(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs);
Tensor gpt2_mlp_backward_input(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy, RecordSet& rec, CallScope& cs);
void gpt2_mlp_backward_weight(const GPT2Dims& d, const GPT2Branch& p, RecordSet& rec, CallScope& cs);

// The LayerNorm backward of a TP unit after its all-reduce: returns dx = dy + LN^T(dln),
// accumulates the LayerNorm weight grads and releases the unit's BPrev records.
Tensor gpt2_norm_finalize(const GPT2Dims& d, const GPT2LayerNorm& p, const Tensor& dy, const Tensor& dln,
                          RecordSet& rec, CallScope& cs);

// ---- recompute (activation checkpointing) of attention / MLP units ---------------------------
// Policies are described in models/stage.h. Per policy, the records F keeps are:
//   attn  Selective: ln.x, ln.mean, ln.rstd, qkv      (drops ln.out, att, y)
//         Full:      ln.x                             (drops ln.mean, ln.rstd, ln.out, qkv, att, y)
//         (fused attention: "lse" in place of "att"; Selective then re-runs the fused forward)
//   mlp   Selective: ln.x, ln.mean, ln.rstd, h        (drops ln.out, gelu)
//         Full:      ln.x                             (drops ln.mean, ln.rstd, ln.out, h, gelu)
std::vector<RecomputedRecord> gpt2_attn_recomputed_records(const GPT2Dims& d, Recompute r);
std::vector<RecomputedRecord> gpt2_mlp_recomputed_records(const GPT2Dims& d, Recompute r);

// The fraction of the unit's forward FLOPs the recompute re-runs (formula in gpt2_units.cpp).
double gpt2_attn_recompute_cost(const GPT2Dims& d, Recompute r);
double gpt2_mlp_recompute_cost(const GPT2Dims& d, Recompute r);

// At the start of B: regenerates the records policy r dropped from the kept ones, with F's
// kernels on F's inputs (bitwise F's values) and F's names and readers. The row-parallel output
// GEMM is not re-run (its result is not a record).
void gpt2_attn_recompute(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs);
void gpt2_mlp_recompute(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs);

// ---- head unit (ln_f, tied LM head, cross-entropy) --------------------------------------------
// Writes the mean loss into `loss` (1,). Chunked (c.chunked(), models/unit_common.h LossChunking):
// the LM head runs through lm_head_forward_chunked and, with gradients, ln_f's backward follows in
// F, which keeps only "dx" for B (every other record released).
void gpt2_head_forward(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, const Tensor& x,
                       const Tensor& targets, const Tensor& loss, const LossChunking& c, RecordSet& rec, CallScope& cs);
// Returns dx (chunked: the one F kept), the gradient w.r.t. the head's input: whole on every rank with the replicated
// vocabulary, this rank's partial for the caller's all-reduce when vocab-parallel
// (head_norm_grad_partials, models/unit_common.h).
Tensor gpt2_head_backward_input(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, float loss_scale,
                                RecordSet& rec, CallScope& cs);
// W: lm_head_backward_weight (models/unit_common.h) with wte.

}  // namespace stp
