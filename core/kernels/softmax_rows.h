// Internal to the cross-entropy kernels (nn_kernels.cpp, vocab_kernels.cpp): the three passes over
// one row of logits every variant is made of, single source for CPU and CUDA.
//
//   row_max          max of the row (exact in any order);
//   row_sum_exp      sum of exp(l - shift) for shift >= max: kLanes partial sums, lane j taking
//                    the entries j, j + kLanes, j + 2 kLanes, ... (the last partial block fills
//                    lanes 0, 1, ...), added up by lanes_total's fixed tree;
//   row_exp_scaled   l = exp(l - shift) * scale in place (the softmax gradient before the target's
//                    correction).
//
// The exponential is exp_nonpositive. The lane order is the order of 8-wide vectors, so on CPUs
// with AVX2 + FMA the f32 rows run through the vector forms (softmax_rows_avx2.cpp), which add the
// same terms in the same order; the two may still differ in the last bits where the vector form
// fuses a multiply and an add (as the CUDA build may). A row is always one task's work, so results
// do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/exp_nonpositive.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STP_SOFTMAX_ROWS_SIMD_BUILT 1
#endif

namespace stp::softmax_rows {

using i64 = std::int64_t;

constexpr i64 kLanes = 8;

#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT)
// The f32 vector forms (softmax_rows_avx2.cpp), host code; used where simd_available().
bool simd_available();  // cpu_has_isa(CpuIsa::Avx2) (core/kernels/cpu_isa.h): AVX2 + FMA, allowed
float simd_row_max(const float* l, i64 n);
float simd_row_sum_exp(const float* l, i64 n, float shift);
void simd_row_exp_scaled(float* l, i64 n, float shift, float scale);
#endif

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): halves of a vector added, then halves again.
STP_HD inline float lanes_total(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// max over l[0, n); -inf for n == 0. NaN entries are skipped (their exp makes the sum NaN).
template <typename T>
STP_HD inline float row_max(const T* l, i64 n) {
#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_row_max(l, n);
#endif
  float mx = -INFINITY;
  for (i64 v = 0; v < n; ++v) mx = to_f32(l[v]) > mx ? to_f32(l[v]) : mx;
  return mx;
}

// sum over l[0, n) of exp(l[v] - shift), shift >= every l[v], in the lane order above.
template <typename T>
STP_HD inline float row_sum_exp(const T* l, i64 n, float shift) {
#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_row_sum_exp(l, n, shift);
#endif
  float acc[kLanes] = {};
  const i64 full = n - n % kLanes;
  for (i64 v = 0; v < full; v += kLanes)
    for (i64 j = 0; j < kLanes; ++j) acc[j] += exp_nonpositive(to_f32(l[v + j]) - shift);
  for (i64 v = full; v < n; ++v) acc[v - full] += exp_nonpositive(to_f32(l[v]) - shift);
  return lanes_total(acc);
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
