// The vector forms of the f32 row passes of softmax_rows.h (the contract is there): 8-wide, for
// GCC host builds on x86-64, run on CPUs with AVX2 + FMA. Host code only: never compiled by nvcc.
// The 32 partials of the canonical row order (core/reduce_order.h) are four v8 accumulators:
// a[q] lane j is partial 8 q + j, taking the entries 8 q + j, 8 q + j + 32, ...; the partial block
// at the end of a row is added with the scalar exponential into partials 0, 1, ...; tree32 adds
// the partials. This is the plain functions' order exactly.
#include "core/kernels/softmax_rows.h"

#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT)

#include "core/kernels/cpu_isa.h"
#include "core/kernels/simd_v8.h"
#include "core/reduce_order.h"

namespace stp::softmax_rows {

using namespace simd_v8;  // NOLINT(google-build-using-namespace): the vector vocabulary of this file

constexpr i64 kPartials = reduce_order::kPartials;
constexpr i64 kV = 8;  // lanes of a v8
static_assert(kPartials == 4 * kV, "four v8 accumulators are the 32 partials");

bool simd_available() { return cpu_has_isa(CpuIsa::Avx2); }

// The maximum in the same partials and tree as the sum (exact in any order but for the sign of a
// zero, which the order then fixes too).
__attribute__((target("avx2,fma"), flatten)) float simd_row_max(const float* l, i64 n) {
  v8 m0 = vsplat(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  i64 v = 0;
  for (; v + kPartials <= n; v += kPartials) {
    const v8 x0 = vload(l + v), x1 = vload(l + v + kV), x2 = vload(l + v + 2 * kV), x3 = vload(l + v + 3 * kV);
    m0 = x0 > m0 ? x0 : m0;
    m1 = x1 > m1 ? x1 : m1;
    m2 = x2 > m2 ? x2 : m2;
    m3 = x3 > m3 ? x3 : m3;
  }
  float a[kPartials];
  vstore(a, m0);
  vstore(a + kV, m1);
  vstore(a + 2 * kV, m2);
  vstore(a + 3 * kV, m3);
  for (i64 j = 0; v + j < n; ++j) a[j] = l[v + j] > a[j] ? l[v + j] : a[j];
  return reduce_order::tree32_max(a);
}

__attribute__((target("avx2,fma"), flatten)) float simd_row_sum_exp(const float* l, i64 n, float shift) {
  const v8 sh = vsplat(shift);
  v8 a0{}, a1{}, a2{}, a3{};
  i64 v = 0;
  for (; v + kPartials <= n; v += kPartials) {
    a0 += exp_v(vload(l + v) - sh);
    a1 += exp_v(vload(l + v + kV) - sh);
    a2 += exp_v(vload(l + v + 2 * kV) - sh);
    a3 += exp_v(vload(l + v + 3 * kV) - sh);
  }
  float a[kPartials];
  vstore(a, a0);
  vstore(a + kV, a1);
  vstore(a + 2 * kV, a2);
  vstore(a + 3 * kV, a3);
  for (i64 j = 0; v + j < n; ++j) a[j] += exp_nonpositive(l[v + j] - shift);
  return reduce_order::tree32(a);
}

__attribute__((target("avx2,fma"), flatten)) void simd_row_exp_scaled(float* l, i64 n, float shift, float scale) {
  const v8 sh = vsplat(shift), sc = vsplat(scale);
  i64 v = 0;
  for (; v + kV <= n; v += kV) vstore(l + v, exp_v(vload(l + v) - sh) * sc);
  for (; v < n; ++v) l[v] = exp_nonpositive(l[v] - shift) * scale;
}

}  // namespace stp::softmax_rows

#endif  // STP_SOFTMAX_ROWS_SIMD_BUILT
