// Llama-family unit passes. Each function narrates its steps; shapes use the names of LlamaDims.
// Every pass is a template on A, the activation storage type (float or bf16, LlamaDims::act).
#include "models/llama_units.h"

#include "base/error.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/llama_kernels.h"
#include "core/kernels/nn_kernels.h"
#include "models/attention_steps.h"
#include "models/branch_steps.h"

namespace stp {
namespace {

using i64 = std::int64_t;
constexpr RecordReader kB = RecordReader::B, kW = RecordReader::W, kPrev = RecordReader::BPrev;

bool grouped(const LlamaDims& d) { return d.K != d.H; }

// ---- the steps F and the recompute share (same kernels, same inputs: bitwise F's records) -------

struct NormOut {
  Tensor out, rstd;
};

// RMSNorm of the unit input; `keep_stats`: rstd is a record (F, Full) or a temporary (Selective).
template <typename A>
NormOut norm_step(const LlamaDims& d, const ParamInfo* w, const Tensor& x, CallScope& cs, bool keep_stats = true) {
  const i64 N = d.N(), C = d.C;
  NormOut r{cs.keep({N, C}, d.act), keep_stats ? cs.keep({N}) : cs.tmp({N})};
  rmsnorm_forward(cs.stream(), r.out.as<A>(), r.rstd.f32(), x.f32(), w->param.f32(), N, C, d.eps);
  return r;
}

// q, k, v of the local heads, RoPE applied to q and k in place: (B, T, QKV).
template <typename A>
Tensor qkv_step(const LlamaDims& d, const LlamaBranch& p, const Tensor& ln, CallScope& cs) {
  Tensor qkv = column_parallel_in<A>(d, p.in_w, p.in_b, ln, d.QKV(), cs);
  A* q = qkv.as<A>();
  rope_forward<A>(cs.stream(), q, d.N(), d.T, d.QKV(), d.H, d.D, d.theta);
  rope_forward<A>(cs.stream(), q + d.QW(), d.N(), d.T, d.QKV(), d.K, d.D, d.theta);
  return qkv;
}

// Fused attention reads q, k, v in place from the packed rows (grouped-query natively).
AttentionLayout attention_layout(const LlamaDims& d) { return {d.B, d.T, d.H, d.K, d.D, d.QKV(), d.QKV(), d.QW()}; }

// The naive kernel reads [q | k | v] with H heads each: with grouped-query attention the k and v
// heads are repeated into a temporary first (gqa_expand).
template <typename A>
const A* naive_qkv(const LlamaDims& d, const Tensor& qkv, CallScope& cs) {
  if (!grouped(d)) return qkv.as<A>();
  Tensor full = cs.tmp({d.B, d.T, 3 * d.QW()}, d.act);
  gqa_expand<A>(cs.stream(), full.as<A>(), qkv.as<A>(), d.N(), d.H, d.K, d.D);
  return full.as<A>();
}

template <typename A>
AttentionOut attention_step(const LlamaDims& d, const Tensor& qkv, CallScope& cs) {
  if (fused(d)) return fused_attention_step<A>(d, attention_layout(d), qkv, cs);
  AttentionOut r{cs.keep({d.B, d.H, d.T, d.T}, d.act), cs.keep({d.B, d.T, d.QW()}, d.act)};
  attention_forward(cs.stream(), r.y.as<A>(), r.core.as<A>(), naive_qkv<A>(d, qkv, cs), d.B, d.T, d.H, d.D);
  return r;
}

template <typename A>
Tensor swiglu_step(const LlamaDims& d, const Tensor& h /*(B, T, 2I)*/, CallScope& cs) {
  Tensor a = cs.keep({d.B, d.T, d.I}, d.act);
  swiglu_forward<A>(cs.stream(), a.as<A>(), h.as<A>(), d.N(), d.I);
  return a;
}

template <typename A>
Tensor norm_with_records(const LlamaDims& d, const ParamInfo* w, const Tensor& x, RecordSet& rec, CallScope& cs,
                         RecordReader stats_reader) {
  NormOut n = norm_step<A>(d, w, x, cs);
  rec.save("ln.x", x, stats_reader);
  rec.save("ln.rstd", n.rstd, stats_reader);
  return n.out;
}

template <typename A>
Tensor norm_recompute(const LlamaDims& d, const ParamInfo* w, Recompute r, RecordSet& rec, CallScope& cs) {
  const bool stats_dropped = r == Recompute::Full;
  NormOut n = norm_step<A>(d, w, rec.get("ln.x"), cs, stats_dropped);
  if (stats_dropped) rec.save("ln.rstd", n.rstd, kPrev);
  rec.save("ln.out", n.out, kW);
  return n.out;
}

// ---- attention ------------------------------------------------------------------------------------

template <typename A>
Tensor attn_forward_t(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  // 1. input_layernorm (RMSNorm, replicated).
  Tensor ln = norm_with_records<A>(d, p.norm, x, rec, cs, kPrev);
  // 2. Column-parallel qkv_proj (+ bias), RoPE on q and k.
  Tensor qkv = qkv_step<A>(d, p, ln, cs);
  // 3. Causal grouped-query attention over the local heads.
  AttentionOut a = attention_step<A>(d, qkv, cs);
  // 4. Row-parallel o_proj: the partial of the next residual stream.
  Tensor out = row_parallel_out<A>(d, p.out_w, nullptr, a.y, d.QW(), x, cs);
  rec.save("ln.out", ln, kW);
  rec.save("qkv", qkv, kB);
  save_attention_records(d, a, rec);
  return out;
}

template <typename A>
Tensor attn_backward_input_t(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy_full, RecordSet& rec,
                             CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  Tensor dy = gemm_dy<A>(d, dy_full, cs);
  // 1. o_proj^T: gradient w.r.t. the attention output of the local heads.
  Tensor dyatt = cs.tmp({d.B, d.T, d.QW()}, d.act);
  linear_backward_input<A, A>(s, dyatt.as<A>(), dy.as<A>(), weight<A>(p.out_w), N, d.QW(), d.C);
  // 2. Attention backward: gradient w.r.t. the rotated q, k, v.
  Tensor dqkv = cs.keep({d.B, d.T, d.QKV()}, d.act);
  Tensor qkv = rec.take("qkv");
  if (fused(d)) {
    Tensor lse = rec.take("lse");
    fused_attention_backward_step<A>(attention_layout(d), dqkv, dyatt, qkv, lse, rec, cs);
    cs.release(std::move(lse));
  } else {
    Tensor att = rec.take("att");
    Tensor datt = cs.tmp({d.B, d.H, d.T, d.T}, d.act);
    if (grouped(d)) {
      Tensor dfull = cs.tmp({d.B, d.T, 3 * d.QW()}, d.act);
      attention_backward(s, dfull.as<A>(), datt.as<A>(), dyatt.as<A>(), naive_qkv<A>(d, qkv, cs), att.as<A>(), d.B, d.T,
                         d.H, d.D);
      gqa_reduce<A>(s, dqkv.as<A>(), dfull.as<A>(), N, d.H, d.K, d.D);
    } else {
      attention_backward(s, dqkv.as<A>(), datt.as<A>(), dyatt.as<A>(), qkv.as<A>(), att.as<A>(), d.B, d.T, d.H, d.D);
    }
    cs.release(std::move(att));
  }
  cs.release(std::move(qkv));
  // 3. RoPE^T on dq and dk: the gradient w.r.t. qkv_proj's output.
  A* dq = dqkv.as<A>();
  rope_backward<A>(s, dq, N, d.T, d.QKV(), d.H, d.D, d.theta);
  rope_backward<A>(s, dq + d.QW(), N, d.T, d.QKV(), d.K, d.D, d.theta);
  // 4. qkv_proj^T: this rank's partial gradient w.r.t. the norm output (all-reduced by the caller).
  return column_parallel_in_backward<A>(d, p.in_w, dy, dqkv, "dqkv", d.QKV(), rec, cs);
}

// ---- MLP --------------------------------------------------------------------------------------------

template <typename A>
Tensor mlp_forward_t(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  // 1. post_attention_layernorm (RMSNorm, replicated).
  Tensor ln = norm_with_records<A>(d, p.norm, x, rec, cs, kPrev);
  // 2. Column-parallel gate_up_proj, then silu(gate) * up.
  Tensor h = column_parallel_in<A>(d, p.in_w, p.in_b, ln, 2 * d.I, cs);
  Tensor a = swiglu_step<A>(d, h, cs);
  // 3. Row-parallel down_proj: the partial of the next residual stream.
  Tensor out = row_parallel_out<A>(d, p.out_w, nullptr, a, d.I, x, cs);
  rec.save("ln.out", ln, kW);
  rec.save("h", h, kB);
  rec.save("act", a, kW);
  return out;
}

template <typename A>
Tensor mlp_backward_input_t(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy_full, RecordSet& rec,
                            CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  Tensor dy = gemm_dy<A>(d, dy_full, cs);
  // 1. down_proj^T, then SwiGLU^T: gradient w.r.t. gate_up_proj's output.
  Tensor da = cs.tmp({d.B, d.T, d.I}, d.act);
  linear_backward_input<A, A>(s, da.as<A>(), dy.as<A>(), weight<A>(p.out_w), N, d.I, d.C);
  Tensor h = rec.take("h");
  Tensor dh = cs.keep({d.B, d.T, 2 * d.I}, d.act);
  swiglu_backward<A>(s, dh.as<A>(), da.as<A>(), h.as<A>(), N, d.I);
  cs.release(std::move(h));
  // 2. gate_up_proj^T: this rank's partial gradient w.r.t. the norm output.
  return column_parallel_in_backward<A>(d, p.in_w, dy, dh, "dh", 2 * d.I, rec, cs);
}

// ---- recompute --------------------------------------------------------------------------------------

template <typename A>
void attn_recompute_t(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  Tensor ln = norm_recompute<A>(d, p.norm, r, rec, cs);
  if (r == Recompute::Full) rec.save("qkv", qkv_step<A>(d, p, ln, cs), kB);
  AttentionOut a = attention_step<A>(d, rec.get("qkv"), cs);
  save_attention_records(d, a, rec);
}

template <typename A>
void mlp_recompute_t(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  Tensor ln = norm_recompute<A>(d, p.norm, r, rec, cs);
  if (r == Recompute::Full) rec.save("h", column_parallel_in<A>(d, p.in_w, p.in_b, ln, 2 * d.I, cs), kB);
  rec.save("act", swiglu_step<A>(d, rec.get("h"), cs), kW);
}

// ---- head ---------------------------------------------------------------------------------------------

// The final norm's backward from dln (no residual gradient). Replicated: exact, nothing to reduce.
// Vocab-parallel: on the partial dln, so dx is a partial for the caller's all-reduce and the weight
// grad is summed here (models/unit_common.h, head_norm_grad_partials).
Tensor head_norm_backward(const LlamaDims& d, ParamInfo& norm, const Tensor& dln, RecordSet& rec, CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  Tensor x = rec.take("ln.x"), rstd = rec.take("ln.rstd");
  Tensor dx = cs.keep({d.B, d.T, d.C});
  Tensor partials = d.vocab_parallel ? head_norm_grad_partials(d.C, cs) : Tensor();
  float* dw = d.vocab_parallel ? partials.f32() : norm.grad.f32();
  rmsnorm_backward_input(s, dx.f32(), nullptr, dln.f32(), x.f32(), rstd.f32(), norm.param.f32(), N, d.C);
  rmsnorm_backward_weight_accumulate(s, dw, dln.f32(), x.f32(), rstd.f32(), N, d.C);
  if (d.vocab_parallel) sum_head_norm_grads(d, partials, {&norm}, cs);
  cs.release(std::move(x));
  cs.release(std::move(rstd));
  return dx;
}

template <typename A>
void head_forward_t(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, const Tensor& x, const Tensor& targets,
                    const Tensor& loss, const LossChunking& c, RecordSet& rec, CallScope& cs) {
  // 1. The final norm; its statistics are read by this unit's own B.
  Tensor ln = norm_with_records<A>(d, &norm, x, rec, cs, kB);
  // 2. logits = norm(x) W^T, and the loss.
  if (!c.chunked()) return lm_head_forward(d, head_w, ln, targets, loss, rec, cs);
  // Chunked: the loss and its gradient at once; B only hands "dx" over.
  Tensor dln = lm_head_forward_chunked(d, head_w, ln, targets, loss, c, cs);
  cs.release(std::move(ln));
  if (c.gradients) rec.save("dx", head_norm_backward(d, norm, dln, rec, cs), kB);
}

template <typename A>
Tensor head_backward_input_t(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, float loss_scale, RecordSet& rec,
                             CallScope& cs) {
  if (rec.has("dx")) return rec.take("dx");  // the chunked head's F computed it
  // 1. dlogits, and dln = dlogits W (vocab-parallel: this rank's partial).
  Tensor dln = lm_head_backward_input(d, head_w, loss_scale, rec, cs);
  // 2. The final norm's backward.
  return head_norm_backward(d, norm, dln, rec, cs);
}

}  // namespace

void llama_prepare_kernels(const LlamaDims& d, Stream& s) {
  if (!fused(d)) return;
  with_act(d, [&](auto a) { prepare_fused_attention<decltype(a)>(s, attention_layout(d)); });
}

Tensor llama_attn_forward(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return attn_forward_t<decltype(a)>(d, p, x, rec, cs); });
}
Tensor llama_attn_backward_input(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy, RecordSet& rec,
                                 CallScope& cs) {
  return with_act(d, [&](auto a) { return attn_backward_input_t<decltype(a)>(d, p, dy, rec, cs); });
}
void llama_attn_backward_weight(const LlamaDims& d, const LlamaBranch& p, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) {
    branch_weight_grads<decltype(a)>(d, p.in_w, p.in_b, p.out_w, rec, cs, "y", d.QW(), "dqkv", d.QKV());
  });
}
Tensor llama_mlp_forward(const LlamaDims& d, const LlamaBranch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return mlp_forward_t<decltype(a)>(d, p, x, rec, cs); });
}
Tensor llama_mlp_backward_input(const LlamaDims& d, const LlamaBranch& p, const Tensor& dy, RecordSet& rec,
                                CallScope& cs) {
  return with_act(d, [&](auto a) { return mlp_backward_input_t<decltype(a)>(d, p, dy, rec, cs); });
}
void llama_mlp_backward_weight(const LlamaDims& d, const LlamaBranch& p, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) {
    branch_weight_grads<decltype(a)>(d, p.in_w, p.in_b, p.out_w, rec, cs, "act", d.I, "dh", 2 * d.I);
  });
}
void llama_attn_recompute(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  if (r == Recompute::None) return;
  with_act(d, [&](auto a) { attn_recompute_t<decltype(a)>(d, p, r, rec, cs); });
}
void llama_mlp_recompute(const LlamaDims& d, const LlamaBranch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  if (r == Recompute::None) return;
  with_act(d, [&](auto a) { mlp_recompute_t<decltype(a)>(d, p, r, rec, cs); });
}
void llama_head_forward(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, const Tensor& x, const Tensor& targets,
                        const Tensor& loss, const LossChunking& c, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) { head_forward_t<decltype(a)>(d, norm, head_w, x, targets, loss, c, rec, cs); });
}
Tensor llama_head_backward_input(const LlamaDims& d, ParamInfo& norm, ParamInfo& head_w, float loss_scale,
                                 RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return head_backward_input_t<decltype(a)>(d, norm, head_w, loss_scale, rec, cs); });
}
std::vector<RecomputedRecord> llama_attn_recomputed_records(const LlamaDims& d, Recompute r) {
  const i64 N = d.N();
  const DType a = d.act, f = DType::F32;
  const RecomputedRecord core = attention_core_record(d, d.H);
  switch (r) {
    case Recompute::None: return {};
    case Recompute::Selective: return {{"ln.out", N * d.C, a}, core, {"y", N * d.QW(), a}};
    case Recompute::Full:
      return {{"ln.rstd", N, f}, {"ln.out", N * d.C, a}, {"qkv", N * d.QKV(), a}, core, {"y", N * d.QW(), a}};
  }
  STP_UNREACHABLE("bad Recompute");
}

std::vector<RecomputedRecord> llama_mlp_recomputed_records(const LlamaDims& d, Recompute r) {
  const i64 N = d.N();
  const DType a = d.act, f = DType::F32;
  switch (r) {
    case Recompute::None: return {};
    case Recompute::Selective: return {{"ln.out", N * d.C, a}, {"act", N * d.I, a}};
    case Recompute::Full:
      return {{"ln.rstd", N, f}, {"ln.out", N * d.C, a}, {"h", N * 2 * d.I, a}, {"act", N * d.I, a}};
  }
  STP_UNREACHABLE("bad Recompute");
}

// FLOP model of the recompute cost (per rank, one microbatch), as GPT-2's (gpt2_units.cpp):
//   RMSNorm 4 N C; qkv_proj 2 N C QKV; RoPE 6 N (QW + KW); attention core 4 B T^2 QW + softmax
//   5 B H T^2 (half of it fused); o_proj 2 N QW C; gate_up 2 N C 2I; SwiGLU 6 N I; down 2 N I C.
double llama_attn_recompute_cost(const LlamaDims& d, Recompute r) {
  const double N = static_cast<double>(d.N()), C = static_cast<double>(d.C), QW = static_cast<double>(d.QW());
  const double KW = static_cast<double>(d.KW()), QKV = static_cast<double>(d.QKV());
  return BranchFlops{4 * N * C, 2 * N * C * QKV + 6 * N * (QW + KW), attention_core_recompute_flops(d, d.H, d.QW()),
                     2 * N * QW * C}
      .cost(r);
}

double llama_mlp_recompute_cost(const LlamaDims& d, Recompute r) {
  const double N = static_cast<double>(d.N()), C = static_cast<double>(d.C), I = static_cast<double>(d.I);
  return BranchFlops{4 * N * C, 2 * N * C * 2 * I, 6 * N * I, 2 * N * I * C}.cost(r);
}

Tensor llama_norm_finalize(const LlamaDims& d, ParamInfo& norm, const Tensor& dy, const Tensor& dln, RecordSet& rec,
                           CallScope& cs) {
  const i64 N = d.N(), C = d.C;
  Stream& s = cs.stream();
  Tensor x = rec.take("ln.x"), rstd = rec.take("ln.rstd");
  Tensor dx = cs.keep({d.B, d.T, C});
  rmsnorm_backward_input(s, dx.f32(), dy.f32(), dln.f32(), x.f32(), rstd.f32(), norm.param.f32(), N, C);
  rmsnorm_backward_weight_accumulate(s, norm.grad.f32(), dln.f32(), x.f32(), rstd.f32(), N, C);
  cs.release(std::move(x));
  cs.release(std::move(rstd));
  return dx;
}

}  // namespace stp
