// The GEMM steps every architecture's branches share (a branch: norm -> column-parallel GEMM -> op
// -> row-parallel GEMM, models/stage_base.h), as templates on A, the activation storage type
// (float or bf16, UnitDims::act). The weights are ParamInfo shards; a null bias is no bias.
#pragma once

#include <cstdint>

#include "core/kernels/nn_kernels.h"
#include "models/unit_common.h"

namespace stp {

// Column-parallel input GEMM: (B, T, width) in d.act from the norm output ln (B, T, C).
template <typename A>
Tensor column_parallel_in(const UnitDims& d, const ParamInfo* in_w, const ParamInfo* in_b, const Tensor& ln,
                          std::int64_t width, CallScope& cs) {
  Tensor out = cs.keep({d.B, d.T, width}, d.act);
  linear_forward<A, A>(cs.stream(), out.as<A>(), ln.as<A>(), weight<A>(in_w), in_b ? in_b->param.f32() : nullptr,
                       nullptr, d.N(), d.C, width);
  return out;
}

// The row-parallel output GEMM: rank 0 folds the residual x and the (replicated) bias in (Note
// [Residual folded into rank 0's partial], models/gpt2_units.h). The partial is f32: it is
// all-reduced into the f32 residual stream.
template <typename A>
Tensor row_parallel_out(const UnitDims& d, const ParamInfo* out_w, const ParamInfo* out_b, const Tensor& in,
                        std::int64_t in_width, const Tensor& x, CallScope& cs) {
  const bool rank0 = d.tp_rank == 0;
  Tensor y = cs.keep({d.B, d.T, d.C});
  linear_forward<A, float>(cs.stream(), y.f32(), in.as<A>(), weight<A>(out_w),
                           rank0 && out_b ? out_b->param.f32() : nullptr, rank0 ? x.f32() : nullptr, d.N(), in_width,
                           d.C);
  return y;
}

// The gradient w.r.t. a unit's output as the GEMMs read it: dy itself in f32, a bf16 copy
// otherwise (which is also what W reads, so the record "dy" is that copy).
template <typename A>
Tensor gemm_dy(const UnitDims& d, const Tensor& dy, CallScope& cs) {
  if constexpr (dtype_of<A>() == DType::F32) return dy;
  Tensor c = cs.keep({d.B, d.T, d.C}, d.act);
  convert(cs.stream(), c.as<A>(), dy.f32(), dy.numel());
  return c;
}

// The last step of B of a branch: g_part = dact W_in^T, the column-parallel GEMM's transpose from
// dact (N, in_width), the gradient of its output: this rank's partial gradient w.r.t. the norm
// output (f32: the caller all-reduces it). Then saves what W reads: "dy" (gemm_dy's) and dact
// under `dact_name`.
template <typename A>
Tensor column_parallel_in_backward(const UnitDims& d, const ParamInfo* in_w, const Tensor& dy, const Tensor& dact,
                                   const char* dact_name, std::int64_t in_width, RecordSet& rec, CallScope& cs) {
  Tensor g_part = cs.keep({d.B, d.T, d.C});
  linear_backward_input<A, float>(cs.stream(), g_part.f32(), dact.as<A>(), weight<A>(in_w), d.N(), d.C, in_width);
  rec.save("dy", dy, RecordReader::W, 'B');
  rec.save(dact_name, dact, RecordReader::W, 'B');
  return g_part;
}

// W of a branch: the row- and column-parallel weight gradients (and the column-parallel bias's,
// when it has one), from the records B left. `act` (N, act_width) is the row-parallel GEMM's
// input, `dact` (N, in_width) the gradient of the column-parallel GEMM's output; "dy" (N, C) and
// "ln.out" (N, C) are common to every branch. A row-parallel bias gradient is not taken here (B
// takes it from the f32 dy).
template <typename A>
void branch_weight_grads(const UnitDims& d, ParamInfo* in_w, ParamInfo* in_b, ParamInfo* out_w, RecordSet& rec,
                         CallScope& cs, const char* act_name, std::int64_t act_width, const char* dact_name,
                         std::int64_t in_width) {
  const std::int64_t N = d.N();
  Stream& s = cs.stream();
  Tensor act = rec.take(act_name), dy = rec.take("dy"), ln = rec.take("ln.out"), dact = rec.take(dact_name);
  linear_backward_weight_accumulate(s, out_w->grad.f32(), static_cast<float*>(nullptr), act.as<A>(), dy.as<A>(), N,
                                    act_width, d.C);
  linear_backward_weight_accumulate(s, in_w->grad.f32(), in_b ? in_b->grad.f32() : nullptr, ln.as<A>(), dact.as<A>(), N,
                                    d.C, in_width);
  for (Tensor* t : {&act, &dy, &ln, &dact}) cs.release(std::move(*t));
}

}  // namespace stp
