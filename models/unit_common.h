// What the unit passes of every architecture share: the sizes every unit knows, the scope of one call
// (its temporaries and the tensors it releases, in stream order), the records a recompute policy
// drops and the recompute's FLOP model, and the units that are the same in every architecture: the
// token embedding and the LM head with its cross-entropy (after the architecture's final norm).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/activation.h"
#include "memory/recompute.h"
#include "models/model_spec.h"
#include "models/stage.h"

namespace stp {

// Sizes one rank works with, common to every architecture (each extends them with its own): N =
// B*T rows of width C, V the vocabulary. act: the storage type of the activations between GEMMs
// (docs/model.md, "Precision"); attention: what the attention records are (docs/model.md,
// Attention).
// Vocabulary rows on this rank (the embedding's and the LM head's): [v0, v0 + Vs), the first Vl
// of them real (the rest padding, docs/model.md, Vocab parallelism); replicated: v0 = 0, Vs = Vl = V.
struct UnitDims {
  std::int64_t B = 0, T = 0, C = 0, V = 0;
  std::int64_t Vs = 0, v0 = 0, Vl = 0;
  bool vocab_parallel = false;         // the vocabulary is split over the TP ranks (tp > 1)
  Communicator* vocab_comm = nullptr;  // the TP group of the embed and head units' collectives
  int tp_rank = 0, tp_size = 1;
  DType act = DType::F32;
  AttentionKernel attention = AttentionKernel::Naive;
  std::int64_t N() const { return B * T; }
};

// The shared sizes of a stage on one TP rank.
UnitDims unit_dims(const StageSpec& spec, int seq_len, int n_embd, int vocab_size, DType act,
                   AttentionKernel attention);

// The checks every architecture's validate (models/registry.h) ends with, once its own keys are
// checked: the split (the TP rank within tp, the stage's layers within the model, a positive
// microbatch size) and a head dimension n_embd / n_head the fused attention kernel supports.
// Throws stp::Error naming the keys.
void validate_split_and_attention(const ModelSpec& model, const StageSpec& spec);

inline bool fused(const UnitDims& d) { return d.attention == AttentionKernel::Fused; }

// Calls fn(A{}) with A = float or bf16 as d.act says: the passes are templates on A and the public
// functions pick the instantiation once.
template <typename Fn>
decltype(auto) with_act(const UnitDims& d, Fn&& fn) {
  if (d.act == DType::Bf16) return fn(bf16{});
  return fn(float{});
}

// The GEMM operand of a weight (its bf16 copy under bf16 precision).
template <typename A>
const A* weight(const ParamInfo* p) {
  return p->compute.as<A>();
}

inline const std::int32_t* as_i32(const Tensor& t) { return t.data<std::int32_t>(); }

// Temporaries of one call: allocated from the stage's allocator and freed in stream order (the
// block is fenced by `s`, so only work enqueued after the free can reuse it): tmp() tensors when the
// scope ends, released records at once, so what the call allocates next may take their bytes.
class CallScope {
 public:
  CallScope(Allocator& alloc, Stream& s) : alloc_(alloc), s_(s) {}
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  Tensor tmp(Shape shape, DType dtype = DType::F32);   // dead after this call
  Tensor keep(Shape shape, DType dtype = DType::F32);  // allocated here, kept by the caller (records, outputs)
  void release(Tensor t);  // last reader enqueued: freed now, in stream order (later allocations may reuse it)
  Stream& stream() { return s_; }
  Allocator& allocator() { return alloc_; }

 private:
  Allocator& alloc_;
  Stream& s_;
  std::vector<Tensor> dead_;
};

// One record a recompute policy drops at the end of F and B regenerates (models/stage.h).
struct RecomputedRecord {
  const char* name;    // without the unit prefix, e.g. "att"
  std::int64_t numel;  // elements
  DType dtype;
  std::size_t bytes() const { return static_cast<std::size_t>(numel) * dtype_size(dtype); }
};

// Right after F: releases (in stream order) the records policy r drops.
void drop_recomputed(const std::vector<RecomputedRecord>& dropped, RecordSet& rec, CallScope& cs);

// The FLOPs of a branch's four steps (norm, column GEMM, the op between, row GEMM) and the share of
// them policy r re-runs: Selective the norm and the op, Full everything up to the row GEMM.
struct BranchFlops {
  double norm, in, op, out;
  double cost(Recompute r) const;
};

// Forward FLOPs, for one microbatch on one TP rank, of what every architecture's units share (the
// pieces of Architecture::unit_flops, models/registry.h): the embed and input units (elementwise:
// B·T·C), the LM head unit (its GEMM over this rank's vocabulary rows, V/tp when vocab-parallel;
// the final norm not counted), and the attention core of an attention unit (scores and weighted
// values of the rank's heads: dense T x T with the naive kernel's GEMMs, the masked half skipped
// by the fused kernel).
double io_unit_flops(const ModelSpec& model, const StageSpec& spec);
double lm_head_unit_flops(const ModelSpec& model, const StageSpec& spec);
double attention_core_flops(const ModelSpec& model, const StageSpec& spec);

// ---- token embedding: x0 = embed[tokens] (+ pos, learned positions, when pos is not null) -------
// F keeps "tokens" for W; W reads them and "dx" (the gradient w.r.t. x0, saved by the stage).
Tensor token_embedding_forward(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, const Tensor& tokens,
                               RecordSet& rec, CallScope& cs);
void token_embedding_backward_weight(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, RecordSet& rec,
                                     CallScope& cs);

// Vocab-parallel (d.vocab_parallel): F looks up this rank's rows only (zero for the other tokens; the
// position term on TP rank 0) and returns this rank's partial of x0, which the caller sums over the
// TP group (the stage returns it for the executor's all-reduce, like a branch's partial); W adds
// into this rank's rows only.

// ---- LM head (replicated on every TP rank, or vocab-parallel) ------------------------------------
// Vocab-parallel: the logits record is (B, T, Vs), this rank's columns; F's loss comes from a max
// and a [sum-exp | target logit] all-reduce over d.vocab_comm inside the unit, so the loss is whole
// on every rank when F returns; B's dln is this rank's partial (head_norm_grad_partials below).
// F from the final norm's output ln (B, T, C) in d.act: logits = ln W^T, the token cross-entropy
// summed over the N targets (a target of -1 adds 0) / N into `loss` (1,) (f32 sums over the
// vocabulary; models/stage.h, loss). Records: "ln.out" (W), "logits", "lse", "targets" (B).
void lm_head_forward(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets, const Tensor& loss,
                     RecordSet& rec, CallScope& cs);
//
// Chunked (c.tokens > 0, models/stage.h set_loss_chunk_tokens): lm_head_forward_chunked instead.
// B: dlogits in place over the logits (the seed: loss_scale / N per counted token, 0 for a
// target of -1), kept for W as
// "dlogits"; returns dln = dlogits W (f32, a temporary of the call) for the final norm's backward.
Tensor lm_head_backward_input(const UnitDims& d, ParamInfo& head_w, float loss_scale, RecordSet& rec, CallScope& cs);
// W: dW += dlogits^T ln.
void lm_head_backward_weight(const UnitDims& d, ParamInfo& head_w, RecordSet& rec, CallScope& cs);

// ---- The chunked LM head ------------------------------------------------------------------------------
// How the head's F runs (StageBase builds it for each F): tokens = rows per chunk (0: unchunked, the
// logits of the whole microbatch kept from F to B); gradients = false in forward-only mode;
// loss_scale = the stage's loss_scale(), the seed's numerator.
struct LossChunking {
  std::int64_t tokens = 0;
  bool gradients = true;
  float loss_scale = 1.0f;
  bool chunked() const { return tokens > 0; }
};

// F and the head's backward fused, `c.tokens` rows at a time (the last chunk shorter when it does
// not divide N): per chunk, logits = ln[rows] W^T (a temporary, n x Vs), the rows' losses and lse
// (vocab-parallel: the max and the [sum-exp | target logit] all-reduces of the chunk's rows), then
// when c.gradients the seed in place (loss_scale / N per counted target, 0 for -1: the same as B's),
// dln[rows] = dlogits W and W's grad += dlogits^T ln[rows]; the chunk's logits are freed before the
// next chunk's are allocated. Then `loss` = the mean of the N losses, as lm_head_forward.
// Returns dln (B, T, C) f32 (a temporary of the call; vocab-parallel: this rank's partial, as
// lm_head_backward_input's), or an undefined tensor when !c.gradients. Saves no record: the head's
// weight gradient is complete when F returns, and lm_head_backward_weight has nothing to do.
// Numerics: each row's logits, loss, lse, seed and dln are the same expressions as unchunked, so
// they are bitwise the unchunked ones wherever the GEMM computes a row by the same arithmetic in a
// GEMM of n rows as in one of N (OpenBLAS: when the chunks cut N where its row tiles do;
// tests/models/loss_chunk_test.cpp); the weight gradient adds the same products in chunk order.
Tensor lm_head_forward_chunked(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                               const Tensor& loss, const LossChunking& c, CallScope& cs);

// Vocab-parallel B of the head. The final norm's backward is linear in dln (its statistics are
// fixed), so each rank applies it to its own partial dln:
//   * the input gradient dx (B, T, C) is then this rank's partial: B returns it and the executor
//     all-reduces it between units like a branch's (braided under the other part's work), after
//     which it is the whole gradient w.r.t. the head's input;
//   * the norm's weight gradients go into head_norm_grad_partials (n floats, zeroed; the
//     accumulate kernels add), which sum_head_norm_grads sums inside the unit (one all-reduce of a
//     few C floats over d.vocab_comm) and adds into the grads of `norm` (in order, each its numel).
// Keeping the weight partials out of dx keeps the all-reduced buffer one (B, T, C) tensor, a block
// the size of every other.
Tensor head_norm_grad_partials(std::int64_t n, CallScope& cs);
void sum_head_norm_grads(const UnitDims& d, const Tensor& partials, const std::vector<ParamInfo*>& norm, CallScope& cs);

}  // namespace stp
