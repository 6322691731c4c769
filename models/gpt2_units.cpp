// GPT-2 unit passes. Each function narrates its steps; shapes use the names of GPT2Dims.
//
// Every pass is a template on A, the activation storage type (float or bf16, GPT2Dims::act), and
// the public functions pick the instantiation once (with_act).
#include "models/gpt2_units.h"

#include "base/error.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/nn_kernels.h"
#include "models/attention_steps.h"
#include "models/branch_steps.h"

namespace stp {
namespace {

using i64 = std::int64_t;
constexpr RecordReader kB = RecordReader::B, kW = RecordReader::W, kPrev = RecordReader::BPrev;

// The steps of F that a recompute re-runs. F and the recompute both call these, so they run the
// same kernels with the same arguments on the same inputs: the regenerated records are bitwise
// F's.
struct LayerNormOut {
  Tensor out, mean, rstd;
};

// LN of the unit input. `keep_stats`: the statistics are records (F, Full recompute) rather than
// temporaries (Selective recompute, which keeps F's).
template <typename A>
LayerNormOut layernorm_step(const GPT2Dims& d, const GPT2LayerNorm& p, const Tensor& x, CallScope& cs,
                            bool keep_stats = true) {
  const i64 N = d.N(), C = d.C;
  LayerNormOut r{cs.keep({N, C}, d.act), keep_stats ? cs.keep({N}) : cs.tmp({N}),
                 keep_stats ? cs.keep({N}) : cs.tmp({N})};
  layernorm_forward(cs.stream(), r.out.as<A>(), r.mean.f32(), r.rstd.f32(), x.f32(), p.w->param.f32(), p.b->param.f32(),
                    N, C);
  return r;
}

// The local heads in GPT-2's packed qkv rows [q | k | v] (core/kernels/attention_kernels.h, Layout).
AttentionLayout attention_layout(const GPT2Dims& d) { return {d.B, d.T, d.H, d.H, d.D, 3 * d.Cl, 3 * d.Cl, d.Cl}; }

template <typename A>
AttentionOut attention_step(const GPT2Dims& d, const Tensor& qkv /*(B, T, 3Cl)*/, CallScope& cs) {
  if (fused(d)) return fused_attention_step<A>(d, attention_layout(d), qkv, cs);
  AttentionOut r{cs.keep({d.B, d.H, d.T, d.T}, d.act), cs.keep({d.B, d.T, d.Cl}, d.act)};
  attention_forward(cs.stream(), r.y.as<A>(), r.core.as<A>(), qkv.as<A>(), d.B, d.T, d.H, d.D);
  return r;
}

template <typename A>
Tensor gelu_step(const GPT2Dims& d, const Tensor& h /*(B, T, Fl)*/, CallScope& cs) {
  Tensor g = cs.keep({d.B, d.T, d.Fl}, d.act);
  gelu_forward(cs.stream(), g.as<A>(), h.as<A>(), d.N() * d.Fl);
  return g;
}

// LN of the unit input; records the input and statistics for B(u-1) and returns the output.
template <typename A>
Tensor layernorm_with_records(const GPT2Dims& d, const GPT2LayerNorm& p, const Tensor& x, RecordSet& rec, CallScope& cs,
                              RecordReader stats_reader) {
  LayerNormOut ln = layernorm_step<A>(d, p, x, cs);
  rec.save("ln.x", x, stats_reader);
  rec.save("ln.mean", ln.mean, stats_reader);
  rec.save("ln.rstd", ln.rstd, stats_reader);
  return ln.out;
}

// The recompute's LN: regenerates ln.out, and the statistics when they were dropped (Full).
template <typename A>
Tensor layernorm_recompute(const GPT2Dims& d, const GPT2LayerNorm& p, Recompute r, RecordSet& rec, CallScope& cs) {
  const bool stats_dropped = r == Recompute::Full;
  LayerNormOut ln = layernorm_step<A>(d, p, rec.get("ln.x"), cs, stats_dropped);
  if (stats_dropped) {
    rec.save("ln.mean", ln.mean, kPrev);
    rec.save("ln.rstd", ln.rstd, kPrev);
  }
  rec.save("ln.out", ln.out, kW);
  return ln.out;
}

// c_proj's bias gradient, in B from the f32 gradient of the unit's output (a column sum over
// tokens, which cancels heavily: from the bf16 copy it would keep little of its f32 value).
// c_proj bias is replicated: every rank has the full dy and computes the same gradient.
void c_proj_bias_grad(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy /*(B, T, C) f32*/, CallScope& cs) {
  column_sum_accumulate(cs.stream(), p.out_b->grad.f32(), dy.f32(), d.N(), d.C);
}

// ---- attention ---------------------------------------------------------------------------------------

template <typename A>
Tensor attn_forward_t(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  // 1. LN1 (replicated).
  Tensor ln = layernorm_with_records<A>(d, p.ln, x, rec, cs, kPrev);
  // 2. Column-parallel c_attn: this rank's q, k, v heads.
  Tensor qkv = column_parallel_in<A>(d, p.in_w, p.in_b, ln, 3 * d.Cl, cs);
  // 3. Causal attention over the local heads.
  AttentionOut a = attention_step<A>(d, qkv, cs);
  // 4. Row-parallel c_proj: the partial of the next residual stream.
  Tensor out = row_parallel_out<A>(d, p.out_w, p.out_b, a.y, d.Cl, x, cs);
  rec.save("ln.out", ln, kW);
  rec.save("qkv", qkv, kB);
  save_attention_records(d, a, rec);
  return out;
}

template <typename A>
Tensor attn_backward_input_t(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy_full, RecordSet& rec,
                             CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  c_proj_bias_grad(d, p, dy_full, cs);
  Tensor dy = gemm_dy<A>(d, dy_full, cs);
  // 1. c_proj^T: gradient w.r.t. the attention output of the local heads.
  Tensor dyatt = cs.tmp({d.B, d.T, d.Cl}, d.act);
  linear_backward_input<A, A>(s, dyatt.as<A>(), dy.as<A>(), weight<A>(p.out_w), N, d.Cl, d.C);
  // 2. Attention backward: gradient w.r.t. q, k, v.
  Tensor dqkv;
  if (fused(d)) {  // recomputes the probabilities tile by tile from qkv, y and the log-sum-exp
    Tensor qkv = rec.take("qkv"), lse = rec.take("lse");
    dqkv = cs.keep({d.B, d.T, 3 * d.Cl}, d.act);
    fused_attention_backward_step<A>(attention_layout(d), dqkv, dyatt, qkv, lse, rec, cs);
    cs.release(std::move(qkv));
    cs.release(std::move(lse));
  } else {
    Tensor qkv = rec.take("qkv"), att = rec.take("att");
    dqkv = cs.keep({d.B, d.T, 3 * d.Cl}, d.act);
    Tensor datt = cs.tmp({d.B, d.H, d.T, d.T}, d.act);
    attention_backward(s, dqkv.as<A>(), datt.as<A>(), dyatt.as<A>(), qkv.as<A>(), att.as<A>(), d.B, d.T, d.H, d.D);
    cs.release(std::move(qkv));
    cs.release(std::move(att));
  }
  // 3. c_attn^T: this rank's partial gradient w.r.t. the LN1 output (all-reduced by the caller).
  return column_parallel_in_backward<A>(d, p.in_w, dy, dqkv, "dqkv", 3 * d.Cl, rec, cs);
}

// ---- MLP -----------------------------------------------------------------------------------------------

template <typename A>
Tensor mlp_forward_t(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  // 1. LN2 (replicated).
  Tensor ln = layernorm_with_records<A>(d, p.ln, x, rec, cs, kPrev);
  // 2. Column-parallel c_fc, then GELU.
  Tensor h = column_parallel_in<A>(d, p.in_w, p.in_b, ln, d.Fl, cs);
  Tensor g = gelu_step<A>(d, h, cs);
  // 3. Row-parallel c_proj: the partial of the next residual stream.
  Tensor out = row_parallel_out<A>(d, p.out_w, p.out_b, g, d.Fl, x, cs);
  rec.save("ln.out", ln, kW);
  rec.save("h", h, kB);
  rec.save("gelu", g, kW);
  return out;
}

template <typename A>
Tensor mlp_backward_input_t(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy_full, RecordSet& rec,
                            CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  c_proj_bias_grad(d, p, dy_full, cs);
  Tensor dy = gemm_dy<A>(d, dy_full, cs);
  // 1. c_proj^T, then GELU^T in place: gradient w.r.t. the c_fc output.
  Tensor dh = cs.keep({d.B, d.T, d.Fl}, d.act);
  linear_backward_input<A, A>(s, dh.as<A>(), dy.as<A>(), weight<A>(p.out_w), N, d.Fl, d.C);
  Tensor h = rec.take("h");
  gelu_backward(s, dh.as<A>(), dh.as<A>(), h.as<A>(), N * d.Fl);
  cs.release(std::move(h));
  // 2. c_fc^T: this rank's partial gradient w.r.t. the LN2 output (all-reduced by the caller).
  return column_parallel_in_backward<A>(d, p.in_w, dy, dh, "dh", d.Fl, rec, cs);
}

// ---- recompute -------------------------------------------------------------------------------------

template <typename A>
void attn_recompute_t(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  // 1. LN1 from the kept input (and its statistics when Full dropped them).
  Tensor ln = layernorm_recompute<A>(d, p.ln, r, rec, cs);
  // 2. c_attn when Full dropped qkv; Selective kept it.
  if (r == Recompute::Full) rec.save("qkv", column_parallel_in<A>(d, p.in_w, p.in_b, ln, 3 * d.Cl, cs), kB);
  // 3. The attention probabilities and output.
  AttentionOut a = attention_step<A>(d, rec.get("qkv"), cs);
  save_attention_records(d, a, rec);
}

template <typename A>
void mlp_recompute_t(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  // 1. LN2 from the kept input (and its statistics when Full dropped them).
  Tensor ln = layernorm_recompute<A>(d, p.ln, r, rec, cs);
  // 2. c_fc when Full dropped h; Selective kept it.
  if (r == Recompute::Full) rec.save("h", column_parallel_in<A>(d, p.in_w, p.in_b, ln, d.Fl, cs), kB);
  // 3. GELU.
  rec.save("gelu", gelu_step<A>(d, rec.get("h"), cs), kW);
}

// ---- head -------------------------------------------------------------------------------------------------

// The ln_f backward from dln (x, mean, rstd taken from the records). The head is the first gradient
// source, so there is no residual gradient to add. Replicated: exact, nothing to reduce.
// Vocab-parallel: on the partial dln, so dx is a partial for the caller's all-reduce and the
// weight grads are summed here (models/unit_common.h, head_norm_grad_partials).
Tensor head_norm_backward(const GPT2Dims& d, const GPT2LayerNorm& ln_f, const Tensor& dln, RecordSet& rec,
                          CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  Tensor x = rec.take("ln.x"), mean = rec.take("ln.mean"), rstd = rec.take("ln.rstd");
  Tensor dx = cs.keep({d.B, d.T, d.C});
  Tensor partials = d.vocab_parallel ? head_norm_grad_partials(2 * d.C, cs) : Tensor();
  float* dw = d.vocab_parallel ? partials.f32() : ln_f.w->grad.f32();
  float* db = d.vocab_parallel ? partials.f32() + d.C : ln_f.b->grad.f32();
  layernorm_backward_input(s, dx.f32(), nullptr, dln.f32(), x.f32(), mean.f32(), rstd.f32(), ln_f.w->param.f32(), N,
                           d.C);
  layernorm_backward_weight_accumulate(s, dw, db, dln.f32(), x.f32(), mean.f32(), rstd.f32(), N, d.C);
  if (d.vocab_parallel) sum_head_norm_grads(d, partials, {ln_f.w, ln_f.b}, cs);
  for (Tensor* t : {&x, &mean, &rstd}) cs.release(std::move(*t));
  return dx;
}

template <typename A>
void head_forward_t(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, const Tensor& x,
                    const Tensor& targets, const Tensor& loss, const LossChunking& c, RecordSet& rec, CallScope& cs) {
  // 1. ln_f; its statistics are read by this unit's own B.
  Tensor ln = layernorm_with_records<A>(d, ln_f, x, rec, cs, kB);
  // 2. Tied LM head: logits = ln_f(x) wte^T, and the loss.
  if (!c.chunked()) return lm_head_forward(d, wte, ln, targets, loss, rec, cs);
  // Chunked: the loss and its gradient at once; B only hands "dx" over.
  Tensor dln = lm_head_forward_chunked(d, wte, ln, targets, loss, c, cs);
  cs.release(std::move(ln));
  if (c.gradients) rec.save("dx", head_norm_backward(d, ln_f, dln, rec, cs), kB);
}

template <typename A>
Tensor head_backward_input_t(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, float loss_scale,
                             RecordSet& rec, CallScope& cs) {
  if (rec.has("dx")) return rec.take("dx");  // the chunked head's F computed it
  // 1. dlogits, and dln = dlogits wte (vocab-parallel: this rank's partial).
  Tensor dln = lm_head_backward_input(d, wte, loss_scale, rec, cs);
  // 2. ln_f backward.
  return head_norm_backward(d, ln_f, dln, rec, cs);
}

}  // namespace

void gpt2_prepare_kernels(const GPT2Dims& d, Stream& s) {
  if (!fused(d)) return;
  with_act(d, [&](auto a) { prepare_fused_attention<decltype(a)>(s, attention_layout(d)); });
}

// ---- public passes: pick the activation type ------------------------------------------------------------

Tensor gpt2_attn_forward(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return attn_forward_t<decltype(a)>(d, p, x, rec, cs); });
}

Tensor gpt2_attn_backward_input(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy, RecordSet& rec,
                                CallScope& cs) {
  return with_act(d, [&](auto a) { return attn_backward_input_t<decltype(a)>(d, p, dy, rec, cs); });
}

void gpt2_attn_backward_weight(const GPT2Dims& d, const GPT2Branch& p, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) {
    branch_weight_grads<decltype(a)>(d, p.in_w, p.in_b, p.out_w, rec, cs, "y", d.Cl, "dqkv", 3 * d.Cl);
  });
}

Tensor gpt2_mlp_forward(const GPT2Dims& d, const GPT2Branch& p, const Tensor& x, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return mlp_forward_t<decltype(a)>(d, p, x, rec, cs); });
}

Tensor gpt2_mlp_backward_input(const GPT2Dims& d, const GPT2Branch& p, const Tensor& dy, RecordSet& rec,
                               CallScope& cs) {
  return with_act(d, [&](auto a) { return mlp_backward_input_t<decltype(a)>(d, p, dy, rec, cs); });
}

void gpt2_mlp_backward_weight(const GPT2Dims& d, const GPT2Branch& p, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) {
    branch_weight_grads<decltype(a)>(d, p.in_w, p.in_b, p.out_w, rec, cs, "gelu", d.Fl, "dh", d.Fl);
  });
}

void gpt2_attn_recompute(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  if (r == Recompute::None) return;
  with_act(d, [&](auto a) { attn_recompute_t<decltype(a)>(d, p, r, rec, cs); });
}

void gpt2_mlp_recompute(const GPT2Dims& d, const GPT2Branch& p, Recompute r, RecordSet& rec, CallScope& cs) {
  if (r == Recompute::None) return;
  with_act(d, [&](auto a) { mlp_recompute_t<decltype(a)>(d, p, r, rec, cs); });
}

void gpt2_head_forward(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, const Tensor& x,
                       const Tensor& targets, const Tensor& loss, const LossChunking& c, RecordSet& rec,
                       CallScope& cs) {
  with_act(d, [&](auto a) { head_forward_t<decltype(a)>(d, ln_f, wte, x, targets, loss, c, rec, cs); });
}

Tensor gpt2_head_backward_input(const GPT2Dims& d, const GPT2LayerNorm& ln_f, ParamInfo& wte, float loss_scale,
                                RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return head_backward_input_t<decltype(a)>(d, ln_f, wte, loss_scale, rec, cs); });
}

// ---- recompute records and costs ------------------------------------------------------------

std::vector<RecomputedRecord> gpt2_attn_recomputed_records(const GPT2Dims& d, Recompute r) {
  const i64 N = d.N();
  const DType a = d.act, f = DType::F32;  // LayerNorm statistics are f32 at every precision
  const RecomputedRecord core = attention_core_record(d, d.H);
  switch (r) {
    case Recompute::None: return {};
    case Recompute::Selective: return {{"ln.out", N * d.C, a}, core, {"y", N * d.Cl, a}};
    case Recompute::Full:
      return {{"ln.mean", N, f}, {"ln.rstd", N, f}, {"ln.out", N * d.C, a}, {"qkv", N * 3 * d.Cl, a}, core,
              {"y", N * d.Cl, a}};
  }
  STP_UNREACHABLE("bad Recompute");
}

std::vector<RecomputedRecord> gpt2_mlp_recomputed_records(const GPT2Dims& d, Recompute r) {
  const i64 N = d.N();
  const DType a = d.act, f = DType::F32;
  switch (r) {
    case Recompute::None: return {};
    case Recompute::Selective: return {{"ln.out", N * d.C, a}, {"gelu", N * d.Fl, a}};
    case Recompute::Full:
      return {{"ln.mean", N, f}, {"ln.rstd", N, f}, {"ln.out", N * d.C, a}, {"h", N * d.Fl, a}, {"gelu", N * d.Fl, a}};
  }
  STP_UNREACHABLE("bad Recompute");
}

// FLOP model (per rank, one microbatch; N = B*T). GEMMs count 2*m*n*k as the kernels run them
// (attention is dense T x T per head: the causal mask is applied by the softmax, not skipped);
// elementwise kernels count their arithmetic per element, tanh/exp/rsqrt as one:
//   LayerNorm  8 N C                 (mean 1, variance 3, normalize 2, affine 2 per element)
//   c_attn     2 N C 3Cl             attention core 4 B T^2 Cl (q k^T and att v)
//   softmax    5 B H T^2             (max, subtract, exp, sum, scale per score)
//   c_fc       2 N C Fl              GELU 9 N Fl (x^3 2, 4 mul/add around tanh, tanh 1, 2 mul)
//   c_proj     2 N Cl C (attn), 2 N Fl C (mlp)
// Bias and residual adds are left out (N x width each, negligible next to the GEMMs).
// Selective re-runs LayerNorm and the attention core + softmax (attn) or GELU (mlp); Full re-runs
// everything up to c_proj. The cost is what is re-run over the whole forward.
double gpt2_attn_recompute_cost(const GPT2Dims& d, Recompute r) {
  const double N = static_cast<double>(d.N()), C = static_cast<double>(d.C), Cl = static_cast<double>(d.Cl);
  // Fused attention skips the masked half of the scores: half the dense core.
  return BranchFlops{8 * N * C, 2 * N * C * 3 * Cl, attention_core_recompute_flops(d, d.H, d.Cl), 2 * N * Cl * C}.cost(
      r);
}

double gpt2_mlp_recompute_cost(const GPT2Dims& d, Recompute r) {
  const double N = static_cast<double>(d.N()), C = static_cast<double>(d.C), Fl = static_cast<double>(d.Fl);
  return BranchFlops{8 * N * C, 2 * N * C * Fl, 9 * N * Fl, 2 * N * Fl * C}.cost(r);
}

// ---- LayerNorm finalize (Note [LayerNorm after the all-reduce]) -------------------------------------

Tensor gpt2_norm_finalize(const GPT2Dims& d, const GPT2LayerNorm& p, const Tensor& dy, const Tensor& dln,
                          RecordSet& rec, CallScope& cs) {
  const i64 N = d.N(), C = d.C;
  Stream& s = cs.stream();
  Tensor x = rec.take("ln.x"), mean = rec.take("ln.mean"), rstd = rec.take("ln.rstd");
  Tensor dx = cs.keep({d.B, d.T, C});
  layernorm_backward_input(s, dx.f32(), dy.f32(), dln.f32(), x.f32(), mean.f32(), rstd.f32(), p.w->param.f32(), N, C);
  layernorm_backward_weight_accumulate(s, p.w->grad.f32(), p.b->grad.f32(), dln.f32(), x.f32(), mean.f32(), rstd.f32(),
                                       N, C);
  for (Tensor* t : {&x, &mean, &rstd}) cs.release(std::move(*t));
  return dx;
}

}  // namespace stp
