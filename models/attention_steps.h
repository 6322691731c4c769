// The causal attention core every architecture's attention branch shares (a branch:
// models/branch_steps.h), on packed rows [q | k | v] of L.NH query heads and L.NKV key/value heads
// of L.D values (core/kernels/attention_kernels.h, Layout): the fused kernel's forward and backward
// reading those rows in place, the records the core leaves for B and W, and what a recompute
// policy drops of them and re-runs, as templates on A, the activation storage type (float or bf16,
// UnitDims::act). The naive kernel's path stays each architecture's own (GPT-2 runs it on the
// packed rows, Llama first repeats grouped key/value heads).
// The fused core runs on the stream's attention library where it offers one for the shape
// (Stream::library_attention_forward / _backward, core/device.h: cuDNN's flash attention on CUDA
// in bf16), on stp's own kernel otherwise; both compute the same problem and leave the same
// records (lse is the log-sum-exp either way), so a forward on one and a backward on the other
// agree. The backward's f32 workspace is taken on both paths, so the memory plan made on the CPU
// equals the GPU's peak whichever path runs.
#pragma once

#include <cstdint>

#include "core/kernels/attention_kernels.h"
#include "models/unit_common.h"

namespace stp {

// What attention keeps for B besides qkv, `core`: naive, "att" (B, H, T, T) probabilities
// (d.act); fused, "lse" (B, H, T) f32, one log-sum-exp per query row. `y` (B, T, H*D) in d.act is
// the output of the local heads: read by W (the output projection's weight gradient), and under
// fused by B too (the backward's do . o).
struct AttentionOut {
  Tensor core, y;
};

// Element offsets of k and v in a packed row.
inline std::int64_t packed_k(const AttentionLayout& L) { return L.NH * L.D; }
inline std::int64_t packed_v(const AttentionLayout& L) { return (L.NH + L.NKV) * L.D; }

// The library's name for L with elements of type A.
template <typename A>
AttentionShape attention_shape(const AttentionLayout& L) {
  return AttentionShape{L.B, L.T, L.NH, L.NKV, L.D, L.ldq, L.ldkv, L.ldo, dtype_of<A>()};
}

// Chooses, at setup, the stream's library plans for the fused core of L (Stream::prepare_attention).
template <typename A>
void prepare_fused_attention(Stream& s, const AttentionLayout& L) {
  (void)s.prepare_attention(attention_shape<A>(L));
}

// F of the fused core on qkv (B, T, L.ldq) in d.act.
template <typename A>
AttentionOut fused_attention_step(const UnitDims& d, const AttentionLayout& L, const Tensor& qkv, CallScope& cs) {
  AttentionOut r{cs.keep({d.B, L.NH, d.T}), cs.keep({d.B, d.T, L.NH * L.D}, d.act)};
  const A* q = qkv.as<A>();
  AttentionForwardArgs lib{attention_shape<A>(L), q, q + packed_k(L), q + packed_v(L), r.y.as<A>(), r.core.f32()};
  if (!cs.stream().library_attention_forward(lib))
    fused_attention_forward<A>(cs.stream(), L, r.y.as<A>(), r.core.f32(), q, q + packed_k(L), q + packed_v(L));
  return r;
}

// B of the fused core: dqkv (packed like qkv, overwritten) from dyatt, the gradient w.r.t. y. The
// probabilities are recomputed tile by tile from qkv, the record "y" (left for W) and lse.
template <typename A>
void fused_attention_backward_step(const AttentionLayout& L, const Tensor& dqkv, const Tensor& dyatt, const Tensor& qkv,
                                   const Tensor& lse, const RecordSet& rec, CallScope& cs) {
  const Tensor& y = rec.get("y");
  Tensor ws = cs.tmp({fused_attention_backward_workspace(L)});
  const A* q = qkv.as<A>();
  A* dq = dqkv.as<A>();
  AttentionBackwardArgs lib{attention_shape<A>(L),
                            q,
                            q + packed_k(L),
                            q + packed_v(L),
                            y.as<A>(),
                            dyatt.as<A>(),
                            lse.f32(),
                            dq,
                            dq + packed_k(L),
                            dq + packed_v(L),
                            ws.f32()};
  if (cs.stream().library_attention_backward(lib)) return;
  fused_attention_backward<A>(cs.stream(), L, dq, dq + packed_k(L), dq + packed_v(L), ws.f32(), dyatt.as<A>(), q,
                              q + packed_k(L), q + packed_v(L), y.as<A>(), lse.f32());
}

// The core's records, from F or a recompute: "att" or "lse" for B, "y" for W (and B under fused).
inline void save_attention_records(const UnitDims& d, const AttentionOut& a, RecordSet& rec) {
  rec.save(fused(d) ? "lse" : "att", a.core, RecordReader::B);
  rec.save("y", a.y, fused(d) ? RecordReader::BW : RecordReader::W);
}

// The core's record of H local heads that both recompute policies drop: the probabilities (naive)
// or the f32 log-sum-exp per query row (fused).
inline RecomputedRecord attention_core_record(const UnitDims& d, std::int64_t H) {
  return fused(d) ? RecomputedRecord{"lse", d.B * H * d.T, DType::F32}
                  : RecomputedRecord{"att", d.B * H * d.T * d.T, d.act};
}

// The core's FLOPs (per rank, one microbatch) for the recompute cost (BranchFlops::op): scores and
// weighted values 4 B T^2 W over the heads' width W = H*D, softmax 5 B H T^2; the fused kernel skips
// the masked half.
inline double attention_core_recompute_flops(const UnitDims& d, std::int64_t H, std::int64_t W) {
  const double B = static_cast<double>(d.B), T = static_cast<double>(d.T), Hd = static_cast<double>(H),
               Wd = static_cast<double>(W);
  return (4 * B * T * T * Wd + 5 * B * Hd * T * T) * (fused(d) ? 0.5 : 1.0);
}

}  // namespace stp
