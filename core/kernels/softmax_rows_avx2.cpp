// The vector forms of the f32 row passes of softmax_rows.h (the contract is there): 8-wide, for
// GCC host builds on x86-64, run on CPUs with AVX2 + FMA. Host code only: never compiled by nvcc.
// Lane j of the accumulator takes the entries j, j + 8, ...; the partial block at the end of a row
// is added with the scalar exponential into lanes 0, 1, ...; lanes_total adds the lanes. This is
// the plain functions' order exactly.
#include "core/kernels/softmax_rows.h"

#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT)

#include "core/kernels/cpu_isa.h"
#include "core/kernels/simd_v8.h"

namespace stp::softmax_rows {

using namespace simd_v8;  // NOLINT(google-build-using-namespace): the vector vocabulary of this file

static_assert(kLanes == 8, "one lane per element of a v8");

bool simd_available() { return cpu_has_isa(CpuIsa::Avx2); }

__attribute__((target("avx2,fma"), flatten)) float simd_row_max(const float* l, i64 n) {
  v8 m = vsplat(-INFINITY);
  i64 v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    const v8 x = vload(l + v);
    m = x > m ? x : m;
  }
  float mx = -INFINITY;
  for (i64 j = 0; j < kLanes; ++j) mx = m[j] > mx ? m[j] : mx;
  for (; v < n; ++v) mx = l[v] > mx ? l[v] : mx;
  return mx;
}

__attribute__((target("avx2,fma"), flatten)) float simd_row_sum_exp(const float* l, i64 n, float shift) {
  const v8 sh = vsplat(shift);
  v8 acc{};
  i64 v = 0;
  for (; v + kLanes <= n; v += kLanes) acc += exp_v(vload(l + v) - sh);
  float a[kLanes];
  vstore(a, acc);
  for (i64 j = 0; v + j < n; ++j) a[j] += exp_nonpositive(l[v + j] - shift);
  return lanes_total(a);
}

__attribute__((target("avx2,fma"), flatten)) void simd_row_exp_scaled(float* l, i64 n, float shift, float scale) {
  const v8 sh = vsplat(shift), sc = vsplat(scale);
  i64 v = 0;
  for (; v + kLanes <= n; v += kLanes) vstore(l + v, exp_v(vload(l + v) - sh) * sc);
  for (; v < n; ++v) l[v] = exp_nonpositive(l[v] - shift) * scale;
}

}  // namespace stp::softmax_rows

#endif  // STP_SOFTMAX_ROWS_SIMD_BUILT
