#include "models/unit_common.h"

#include <algorithm>

#include "base/error.h"
#include "core/comm.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/nn_kernels.h"
#include "core/kernels/vocab_kernels.h"

namespace stp {
namespace {

using i64 = std::int64_t;
constexpr RecordReader kB = RecordReader::B, kW = RecordReader::W;

Communicator& vocab_comm(const UnitDims& d) {
  STP_ASSERT(d.vocab_comm != nullptr, "a vocab-parallel stage (tp ", d.tp_size,
             ") without StageSpec::vocab_comm: the embed and head units cannot reduce over the TP group");
  return *d.vocab_comm;
}

// Vocab-parallel F of the head: logits (B, T, Vs) of this rank's rows; the loss through the max
// and the [sum-exp | target logit] all-reduces (core/kernels/vocab_kernels.h), so every rank holds
// the same loss and lse and no rank ever holds a full row of logits.
template <typename A>
void lm_head_forward_vocab(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                           const Tensor& loss, RecordSet& rec, CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  Communicator& comm = vocab_comm(d);
  Tensor logits = cs.keep({d.B, d.T, d.Vs}, d.act);
  gemm(s, false, true, N, d.Vs, d.C, ln.as<A>(), d.C, weight<A>(&head_w), d.C, logits.as<A>(), d.Vs);
  Tensor max = cs.tmp({N}), partials = cs.tmp({2 * N}), losses = cs.tmp({N}), lse = cs.keep({N});
  vocab_ce_max(s, max.f32(), logits.as<A>(), N, d.Vs, d.Vl);
  comm.all_reduce_max(s, max.f32(), static_cast<std::size_t>(N));
  vocab_ce_partials(s, partials.f32(), logits.as<A>(), max.f32(), as_i32(targets), N, d.Vs, d.Vl, d.v0);
  comm.all_reduce_sum(s, partials.f32(), static_cast<std::size_t>(2 * N));
  vocab_ce_finish(s, loss.f32(), losses.f32(), lse.f32(), max.f32(), partials.f32(), as_i32(targets), N);
  rec.save("ln.out", ln, kW);
  rec.save("logits", logits, kB);
  rec.save("lse", lse, kB);
  rec.save("targets", targets, kB);
}

template <typename A>
void lm_head_forward_t(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                       const Tensor& loss, RecordSet& rec, CallScope& cs) {
  if (d.vocab_parallel) return lm_head_forward_vocab<A>(d, head_w, ln, targets, loss, rec, cs);
  const i64 N = d.N();
  Stream& s = cs.stream();
  // 1. logits = ln W^T.
  Tensor logits = cs.keep({d.B, d.T, d.V}, d.act);
  gemm(s, false, true, N, d.V, d.C, ln.as<A>(), d.C, weight<A>(&head_w), d.C, logits.as<A>(), d.V);
  // 2. Mean token cross-entropy (f32 sums over the vocabulary).
  Tensor losses = cs.tmp({N}), lse = cs.keep({N});
  cross_entropy_forward(s, loss.f32(), losses.f32(), lse.f32(), logits.as<A>(), as_i32(targets), N, d.V);
  rec.save("ln.out", ln, kW);
  rec.save("logits", logits, kB);
  rec.save("lse", lse, kB);
  rec.save("targets", targets, kB);
}

template <typename A>
Tensor lm_head_backward_input_t(const UnitDims& d, ParamInfo& head_w, float loss_scale, RecordSet& rec, CallScope& cs) {
  const i64 N = d.N();
  Stream& s = cs.stream();
  // 1. dlogits in place over the logits (this rank's columns when vocab-parallel).
  Tensor logits = rec.take("logits"), lse = rec.take("lse"), targets = rec.take("targets");
  const float scale = loss_scale / static_cast<float>(N);
  if (d.vocab_parallel)
    vocab_ce_backward_inplace(s, logits.as<A>(), lse.f32(), as_i32(targets), scale, N, d.Vs, d.Vl, d.v0);
  else cross_entropy_backward_inplace(s, logits.as<A>(), lse.f32(), as_i32(targets), scale, N, d.V);
  cs.release(std::move(lse));
  cs.release(std::move(targets));
  // 2. dln = dlogits W; vocab-parallel: this rank's rows' share (head_norm_grad_partials).
  Tensor dln = cs.tmp({d.B, d.T, d.C});
  gemm(s, false, false, N, d.C, d.Vs, logits.as<A>(), d.Vs, weight<A>(&head_w), d.C, dln.f32(), d.C);
  rec.save("dlogits", logits, kW, 'B');
  return dln;
}

template <typename A>
void lm_head_backward_weight_t(const UnitDims& d, ParamInfo& head_w, RecordSet& rec, CallScope& cs) {
  Tensor dlogits = rec.take("dlogits"), ln = rec.take("ln.out");
  gemm(cs.stream(), true, false, d.Vs, d.C, d.N(), dlogits.as<A>(), d.Vs, ln.as<A>(), d.C, head_w.grad.f32(), d.C, 1.0f,
       1.0f);
  cs.release(std::move(dlogits));
  cs.release(std::move(ln));
}

// One chunk of lm_head_forward_chunked: rows [r0, r0 + n) of the microbatch.
template <typename A>
void lm_head_chunk(const UnitDims& d, ParamInfo& head_w, const A* ln, const std::int32_t* targets, float* losses,
                   float* dln, const LossChunking& c, i64 r0, i64 n, CallScope& cs) {
  Stream& s = cs.stream();
  CallScope chunk(cs.allocator(), s);  // the chunk's temporaries are free before the next chunk allocates
  Tensor logits = chunk.tmp({n, d.Vs}, d.act), lse = chunk.tmp({n});
  A* l = logits.as<A>();
  const std::int32_t* t = targets + r0;
  gemm(s, false, true, n, d.Vs, d.C, ln + r0 * d.C, d.C, weight<A>(&head_w), d.C, l, d.Vs);
  if (d.vocab_parallel) {
    Communicator& comm = vocab_comm(d);
    Tensor max = chunk.tmp({n}), partials = chunk.tmp({2 * n});
    vocab_ce_max(s, max.f32(), l, n, d.Vs, d.Vl);
    comm.all_reduce_max(s, max.f32(), static_cast<std::size_t>(n));
    vocab_ce_partials(s, partials.f32(), l, max.f32(), t, n, d.Vs, d.Vl, d.v0);
    comm.all_reduce_sum(s, partials.f32(), static_cast<std::size_t>(2 * n));
    vocab_ce_rows(s, losses + r0, lse.f32(), max.f32(), partials.f32(), t, n);
  } else {
    cross_entropy_rows(s, losses + r0, lse.f32(), l, t, n, d.V);
  }
  if (!c.gradients) return;
  const float scale = c.loss_scale / static_cast<float>(d.N());  // B's seed (lm_head_backward_input)
  if (d.vocab_parallel) vocab_ce_backward_inplace(s, l, lse.f32(), t, scale, n, d.Vs, d.Vl, d.v0);
  else cross_entropy_backward_inplace(s, l, lse.f32(), t, scale, n, d.V);
  gemm(s, false, false, n, d.C, d.Vs, l, d.Vs, weight<A>(&head_w), d.C, dln + r0 * d.C, d.C);
  gemm(s, true, false, d.Vs, d.C, n, l, d.Vs, ln + r0 * d.C, d.C, head_w.grad.f32(), d.C, 1.0f, 1.0f);
}

template <typename A>
Tensor lm_head_forward_chunked_t(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                                 const Tensor& loss, const LossChunking& c, CallScope& cs) {
  STP_ASSERT(c.chunked(), "lm_head_forward_chunked with ", c.tokens, " tokens per chunk");
  const i64 N = d.N();
  Tensor losses = cs.tmp({N});
  Tensor dln = c.gradients ? cs.tmp({d.B, d.T, d.C}) : Tensor();
  for (i64 r0 = 0; r0 < N; r0 += c.tokens)
    lm_head_chunk<A>(d, head_w, ln.as<A>(), as_i32(targets), losses.f32(), c.gradients ? dln.f32() : nullptr, c, r0,
                     std::min(c.tokens, N - r0), cs);
  mean_of_rows(cs.stream(), loss.f32(), losses.f32(), N);
  return dln;
}

}  // namespace

CallScope::~CallScope() {
  // Stream-ordered release (core/tensor.h): the bytes were used on this stream up to here.
  for (const Tensor& t : dead_) t.record_use(s_);
  dead_.clear();
}

Tensor CallScope::tmp(Shape shape, DType dtype) {
  Tensor t = Tensor::empty(alloc_, std::move(shape), dtype);
  dead_.push_back(t);
  return t;
}

Tensor CallScope::keep(Shape shape, DType dtype) { return Tensor::empty(alloc_, std::move(shape), dtype); }

// Freed now, not at the end of the call: the bytes are fenced by this stream (stream-ordered
// reuse), so what the call allocates next may take them — that lowers the working set of B.
void CallScope::release(Tensor t) {
  if (t.defined()) t.record_use(s_);
}

void drop_recomputed(const std::vector<RecomputedRecord>& dropped, RecordSet& rec, CallScope& cs) {
  for (const RecomputedRecord& r : dropped) {
    Tensor t = rec.take(r.name);
    STP_ASSERT(t.numel() == r.numel && t.dtype() == r.dtype, "recomputed record ", r.name, " is ", t.numel(), " ",
               to_string(t.dtype()), " elements, not ", r.numel, " ", to_string(r.dtype));
    cs.release(std::move(t));
  }
}

void validate_split_and_attention(const ModelSpec& m, const StageSpec& s) {
  STP_CHECK(s.tp_rank >= 0 && s.tp_rank < s.tp_size, "tp rank ", s.tp_rank, " outside [0, ", s.tp_size, ")");
  STP_CHECK(0 <= s.layer_begin && s.layer_begin <= s.layer_end && s.layer_end <= m.n_layer, "stage layers [",
            s.layer_begin, ", ", s.layer_end, ") outside [0, ", m.n_layer, "]");
  STP_CHECK(s.micro_batch_size >= 1, "train.micro_batch_size must be positive, got ", s.micro_batch_size);
  STP_CHECK(m.attention == AttentionKernel::Naive || m.n_embd / m.n_head <= kMaxAttentionHeadDim,
            "model.attention: fused supports head dimensions n_embd / n_head up to ", kMaxAttentionHeadDim, ", got ",
            m.n_embd / m.n_head, "; use model.attention: naive");
}

UnitDims unit_dims(const StageSpec& spec, int seq_len, int n_embd, int vocab_size, DType act,
                   AttentionKernel attention) {
  UnitDims d;
  d.B = spec.micro_batch_size;
  d.T = seq_len;
  d.C = n_embd;
  d.V = vocab_size;
  d.Vs = d.Vl = vocab_size;
  if (spec.vocab_sharded()) {
    d.vocab_parallel = true;
    d.vocab_comm = spec.vocab_comm;
    d.Vs = vocab_rows(vocab_size, spec.tp_size);
    d.v0 = spec.tp_rank * d.Vs;
    d.Vl = std::max<std::int64_t>(0, std::min<std::int64_t>(d.Vs, vocab_size - d.v0));
  }
  d.tp_rank = spec.tp_rank;
  d.tp_size = spec.tp_size;
  d.act = act;
  d.attention = attention;
  return d;
}

double BranchFlops::cost(Recompute r) const {
  const double total = norm + in + op + out;
  switch (r) {
    case Recompute::None: return 0.0;
    case Recompute::Selective: return (norm + op) / total;
    case Recompute::Full: return (norm + in + op) / total;
  }
  STP_UNREACHABLE("bad Recompute");
}

double io_unit_flops(const ModelSpec& m, const StageSpec& s) {
  const double N = static_cast<double>(s.micro_batch_size) * m.seq_len;
  return N * m.n_embd;
}

double lm_head_unit_flops(const ModelSpec& m, const StageSpec& s) {
  const double N = static_cast<double>(s.micro_batch_size) * m.seq_len, tp = s.tp_size;
  return 2 * N * m.n_embd * m.vocab_size / (s.vocab_parallel ? tp : 1);
}

double attention_core_flops(const ModelSpec& m, const StageSpec& s) {
  const double B = s.micro_batch_size, T = m.seq_len, C = m.n_embd, tp = s.tp_size;
  return (m.attention == AttentionKernel::Naive ? 4 : 2) * B * T * T * C / tp;
}

Tensor token_embedding_forward(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, const Tensor& tokens,
                               RecordSet& rec, CallScope& cs) {
  Tensor x = cs.keep({d.B, d.T, d.C});
  if (d.vocab_parallel) {  // this rank's rows (zero elsewhere) and the positions on rank 0: the caller sums them
    const float* wpe = pos && d.tp_rank == 0 ? pos->param.f32() : nullptr;
    vocab_embedding_forward(cs.stream(), x.f32(), as_i32(tokens), embed.param.f32(), wpe, d.B, d.T, d.C, d.v0, d.Vs);
    rec.save("tokens", tokens, kW);
    return x;
  }
  embedding_forward(cs.stream(), x.f32(), as_i32(tokens), embed.param.f32(), pos ? pos->param.f32() : nullptr, d.B, d.T,
                    d.C);
  rec.save("tokens", tokens, kW);
  return x;
}

void token_embedding_backward_weight(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, RecordSet& rec,
                                     CallScope& cs) {
  Tensor tokens = rec.take("tokens"), dx = rec.take("dx");
  if (d.vocab_parallel) {  // dx is the whole gradient on every rank: each adds its own rows, and all the positions
    Tensor ws = cs.tmp({vocab_embedding_backward_workspace(d.Vs, d.N())});
    vocab_embedding_backward_accumulate(cs.stream(), embed.grad.f32(), pos ? pos->grad.f32() : nullptr, dx.f32(),
                                        as_i32(tokens), ws.data<std::int32_t>(), d.B, d.T, d.C, d.v0, d.Vs);
    cs.release(std::move(tokens));
    cs.release(std::move(dx));
    return;
  }
  Tensor ws = cs.tmp({embedding_backward_workspace(d.V, d.N())});  // int32 in 4-byte elements
  embedding_backward_accumulate(cs.stream(), embed.grad.f32(), pos ? pos->grad.f32() : nullptr, dx.f32(),
                                as_i32(tokens), ws.data<std::int32_t>(), d.B, d.T, d.C, d.V);
  cs.release(std::move(tokens));
  cs.release(std::move(dx));
}

Tensor head_norm_grad_partials(std::int64_t n, CallScope& cs) {
  Tensor g = cs.tmp({n});
  cs.stream().zero(g.raw(), g.bytes());
  return g;
}

void sum_head_norm_grads(const UnitDims& d, const Tensor& partials, const std::vector<ParamInfo*>& norm,
                         CallScope& cs) {
  Stream& s = cs.stream();
  vocab_comm(d).all_reduce_sum(s, partials.f32(), static_cast<std::size_t>(partials.numel()));
  i64 at = 0;
  for (ParamInfo* w : norm) {  // grad += the summed partials
    add(s, w->grad.f32(), w->grad.f32(), partials.f32() + at, w->grad.numel());
    at += w->grad.numel();
  }
  STP_ASSERT(at == partials.numel(), "the norm's weight gradients hold ", at, " floats, the partials ",
             partials.numel());
}

void lm_head_forward(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets, const Tensor& loss,
                     RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) { lm_head_forward_t<decltype(a)>(d, head_w, ln, targets, loss, rec, cs); });
}

Tensor lm_head_backward_input(const UnitDims& d, ParamInfo& head_w, float loss_scale, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return lm_head_backward_input_t<decltype(a)>(d, head_w, loss_scale, rec, cs); });
}

void lm_head_backward_weight(const UnitDims& d, ParamInfo& head_w, RecordSet& rec, CallScope& cs) {
  if (!rec.has("dlogits")) return;  // chunked: F accumulated the weight gradient already
  with_act(d, [&](auto a) { lm_head_backward_weight_t<decltype(a)>(d, head_w, rec, cs); });
}

Tensor lm_head_forward_chunked(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                               const Tensor& loss, const LossChunking& c, CallScope& cs) {
  return with_act(d,
                  [&](auto a) { return lm_head_forward_chunked_t<decltype(a)>(d, head_w, ln, targets, loss, c, cs); });
}

}  // namespace stp
