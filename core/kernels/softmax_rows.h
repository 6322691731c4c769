// Internal to the cross-entropy kernels (nn_kernels.cpp, vocab_kernels.cpp): the three passes over
// one row of logits every variant is made of, single source for CPU and CUDA.
//
//   row_max          max of the row (exact in any order);
//   row_sum_exp      sum of exp(l - shift) for shift >= max, in the canonical row order of
//                    core/reduce_order.h (32 strided partials, then tree32), through the row
//                    reduction shape (core/launch_shape.h: RowReduce): one warp per row on a GPU;
//   row_exp_scaled   l = exp(l - shift) * scale in place (the softmax gradient before the target's
//                    correction), on a segment of a row.
//
// The exponential is exp_nonpositive. On CPUs with AVX2 + FMA the f32 rows run through the vector
// forms (softmax_rows_avx2.cpp): four 8-wide accumulators are the 32 partials, added by the same
// tree, so they add the same terms in the same order; they may still differ in the last bits where
// the vector form fuses a multiply and an add (as the CUDA build may). A row's result does not
// depend on the thread count or the split.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/exp_nonpositive.h"
#include "core/launch_shape.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STP_SOFTMAX_ROWS_SIMD_BUILT 1
#endif

namespace stp::softmax_rows {

using i64 = std::int64_t;

#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT)
// The f32 vector forms (softmax_rows_avx2.cpp), host code; used where simd_available().
bool simd_available();  // cpu_has_isa(CpuIsa::Avx2) (core/kernels/cpu_isa.h): AVX2 + FMA, allowed
float simd_row_max(const float* l, i64 n);
float simd_row_sum_exp(const float* l, i64 n, float shift);
void simd_row_exp_scaled(float* l, i64 n, float shift, float scale);
#endif

// max over l[0, n) for the task p of the row launch rr; -inf for n == 0. NaN entries are skipped
// (their exp makes the sum NaN).
template <typename T>
STP_HD inline float row_max(const RowReduce& rr, RowReduce::Part p, const T* l, i64 n) {
#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_row_max(l, n);
#endif
  return rr.max(p, n, [&](i64 v) { return to_f32(l[v]); });
}

// sum over l[0, n) of exp(l[v] - shift), shift >= every l[v], in the canonical row order.
template <typename T>
STP_HD inline float row_sum_exp(const RowReduce& rr, RowReduce::Part p, const T* l, i64 n, float shift) {
#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_row_sum_exp(l, n, shift);
#endif
  return rr.sum(p, n, [&](i64 v) { return exp_nonpositive(to_f32(l[v]) - shift); });
}

// l[v] = exp(l[v] - shift) * scale for v in [0, n), shift >= every l[v], each stored once as T.
template <typename T>
STP_HD inline void row_exp_scaled(T* l, i64 n, float shift, float scale) {
#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_row_exp_scaled(l, n, shift, scale);
#endif
  for (i64 v = 0; v < n; ++v) l[v] = from_f32<T>(exp_nonpositive(to_f32(l[v]) - shift) * scale);
}

}  // namespace stp::softmax_rows
