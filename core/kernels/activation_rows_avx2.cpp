// The vector forms of the f32 activation runs of activation_rows.h (the contract is there): 8-wide,
// for GCC host builds on x86-64, run on CPUs with AVX2 + FMA. Host code only: never compiled by
// nvcc. Built with -ffp-contract=off (CMakeLists.txt) and written as the same operations in the same
// order as the plain runs, so each lane rounds exactly as the plain code does; the last n % 8
// elements take the plain per-element formulas.
#include "core/kernels/activation_rows.h"

#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT)

#include "core/kernels/cpu_isa.h"
#include "core/kernels/simd_v8.h"

namespace stp::activation_rows {

using namespace simd_v8;  // NOLINT(google-build-using-namespace): the vector vocabulary of this file

namespace {

constexpr i64 kLanes = 8;

// sigmoid on 8 lanes (comparisons select per lane).
STP_V8_INLINE v8 sigmoid_v(v8 x) {
  const v8 zero{};
  const v8 e = exp_v(x >= zero ? -x : x);
  const v8 r = 1.0f / (1.0f + e);
  return x >= zero ? r : e * r;
}

STP_V8_INLINE v8 gelu_s_v(v8 v) { return sigmoid_v(2.0f * (kGeluC * (v + kGeluA * v * v * v))); }

}  // namespace

bool simd_available() { return cpu_has_isa(CpuIsa::Avx2); }

__attribute__((target("avx2,fma"), flatten)) void simd_gelu_run(float* y, const float* x, i64 n) {
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v8 v = vload(x + i);
    vstore(y + i, v * gelu_s_v(v));
  }
  for (; i < n; ++i) y[i] = gelu_value(x[i]);
}

__attribute__((target("avx2,fma"), flatten)) void simd_gelu_backward_run(float* dx, const float* dy, const float* x,
                                                                         i64 n) {
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v8 v = vload(x + i), sg = gelu_s_v(v);
    const v8 du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    vstore(dx + i, vload(dy + i) * (sg + v * du * 2.0f * sg * (1.0f - sg)));
  }
  for (; i < n; ++i) dx[i] = gelu_grad(x[i], dy[i]);
}

__attribute__((target("avx2,fma"), flatten)) void simd_swiglu_run(float* o, const float* g, const float* u, i64 n) {
  i64 j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const v8 gv = vload(g + j);
    vstore(o + j, gv * sigmoid_v(gv) * vload(u + j));
  }
  plain_swiglu_run(o + j, g + j, u + j, n - j);
}

__attribute__((target("avx2,fma"), flatten)) void simd_swiglu_backward_run(float* dg, float* du, const float* dy,
                                                                           const float* g, const float* u, i64 n) {
  i64 j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const v8 gv = vload(g + j), uv = vload(u + j), dv = vload(dy + j), sg = sigmoid_v(gv);
    vstore(dg + j, dv * uv * sg * (1.0f + gv * (1.0f - sg)));
    vstore(du + j, dv * gv * sg);
  }
  plain_swiglu_backward_run(dg + j, du + j, dy + j, g + j, u + j, n - j);
}

}  // namespace stp::activation_rows

#endif  // STP_ACTIVATION_ROWS_SIMD_BUILT
