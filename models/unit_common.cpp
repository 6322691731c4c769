#include "models/unit_common.h"

#include "base/error.h"
#include "core/kernels/nn_kernels.h"

namespace stp {
namespace {

using i64 = std::int64_t;
constexpr RecordReader kB = RecordReader::B, kW = RecordReader::W;

template <typename A>
void lm_head_forward_t(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets,
                       const Tensor& loss, RecordSet& rec, CallScope& cs) {
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
  // 1. dlogits in place over the logits.
  Tensor logits = rec.take("logits"), lse = rec.take("lse"), targets = rec.take("targets");
  cross_entropy_backward_inplace(s, logits.as<A>(), lse.f32(), as_i32(targets), loss_scale / static_cast<float>(N), N,
                                 d.V);
  cs.release(lse);
  cs.release(targets);
  // 2. dln = dlogits W.
  Tensor dln = cs.tmp({d.B, d.T, d.C});
  gemm(s, false, false, N, d.C, d.V, logits.as<A>(), d.V, weight<A>(&head_w), d.C, dln.f32(), d.C);
  rec.save("dlogits", logits, kW, 'B');
  return dln;
}

template <typename A>
void lm_head_backward_weight_t(const UnitDims& d, ParamInfo& head_w, RecordSet& rec, CallScope& cs) {
  Tensor dlogits = rec.take("dlogits"), ln = rec.take("ln.out");
  gemm(cs.stream(), true, false, d.V, d.C, d.N(), dlogits.as<A>(), d.V, ln.as<A>(), d.C, head_w.grad.f32(), d.C, 1.0f,
       1.0f);
  cs.release(dlogits);
  cs.release(ln);
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

void CallScope::release(Tensor t) {
  if (t.defined()) dead_.push_back(std::move(t));
}

void drop_recomputed(const std::vector<RecomputedRecord>& dropped, RecordSet& rec, CallScope& cs) {
  for (const RecomputedRecord& r : dropped) {
    Tensor t = rec.take(r.name);
    STP_ASSERT(t.numel() == r.numel && t.dtype() == r.dtype, "recomputed record ", r.name, " is ", t.numel(), " ",
               to_string(t.dtype()), " elements, not ", r.numel, " ", to_string(r.dtype));
    cs.release(std::move(t));
  }
}

UnitDims unit_dims(const StageSpec& spec, int seq_len, int n_embd, int vocab_size, DType act,
                   AttentionKernel attention) {
  UnitDims d;
  d.B = spec.micro_batch_size;
  d.T = seq_len;
  d.C = n_embd;
  d.V = vocab_size;
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

Tensor token_embedding_forward(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, const Tensor& tokens,
                               RecordSet& rec, CallScope& cs) {
  Tensor x = cs.keep({d.B, d.T, d.C});
  embedding_forward(cs.stream(), x.f32(), as_i32(tokens), embed.param.f32(), pos ? pos->param.f32() : nullptr, d.B, d.T,
                    d.C);
  rec.save("tokens", tokens, kW);
  return x;
}

void token_embedding_backward_weight(const UnitDims& d, ParamInfo& embed, ParamInfo* pos, RecordSet& rec,
                                     CallScope& cs) {
  Tensor tokens = rec.take("tokens"), dx = rec.take("dx");
  Tensor ws = cs.tmp({embedding_backward_workspace(d.V, d.N())});  // int32 in 4-byte elements
  embedding_backward_accumulate(cs.stream(), embed.grad.f32(), pos ? pos->grad.f32() : nullptr, dx.f32(),
                                as_i32(tokens), ws.data<std::int32_t>(), d.B, d.T, d.C, d.V);
  cs.release(tokens);
  cs.release(dx);
}

void lm_head_forward(const UnitDims& d, ParamInfo& head_w, const Tensor& ln, const Tensor& targets, const Tensor& loss,
                     RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) { lm_head_forward_t<decltype(a)>(d, head_w, ln, targets, loss, rec, cs); });
}

Tensor lm_head_backward_input(const UnitDims& d, ParamInfo& head_w, float loss_scale, RecordSet& rec, CallScope& cs) {
  return with_act(d, [&](auto a) { return lm_head_backward_input_t<decltype(a)>(d, head_w, loss_scale, rec, cs); });
}

void lm_head_backward_weight(const UnitDims& d, ParamInfo& head_w, RecordSet& rec, CallScope& cs) {
  with_act(d, [&](auto a) { lm_head_backward_weight_t<decltype(a)>(d, head_w, rec, cs); });
}

}  // namespace stp
