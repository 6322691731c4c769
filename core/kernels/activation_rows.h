// Internal to the activation kernels (nn_kernels.cpp: GELU; llama_kernels.cpp: SwiGLU): the
// logistic sigmoid both are built on and their passes over a run of contiguous elements, single
// source for CPU and CUDA.
//
//   sigmoid(x)           1 / (1 + exp(-x)) through exp_nonpositive: with e = exp(-|x|),
//                        1 / (1 + e) for x >= 0 and e / (1 + e) below (no exp of a positive
//                        argument, so nothing overflows);
//   gelu_run             y = x * s, s = 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
//                        (the tanh approximation of GELU, GPT-2's);
//   gelu_backward_run    dx = dy * (s + x u' 2 s (1 - s))  (tanh' = 1 - t^2 = 4 s (1 - s));
//   swiglu_run           o = silu(g) * u, silu(g) = g * sigmoid(g);
//   swiglu_backward_run  dg = dy u s (1 + g (1 - s)), du = dy g s, s = sigmoid(g).
//
// Every element is computed on its own, so a result never depends on how the elements are split.
// On CPUs with AVX2 + FMA the f32 runs take 8-wide forms (activation_rows_avx2.cpp) of the same
// operations in the same order; that file is compiled without contracting a multiply and an add
// into one instruction (as the plain host code, built for baseline x86-64, never does), so the
// vector forms are bitwise the plain ones (ActivationRows.VectorFormsAreBitwiseThePlainOnes). A
// CUDA build may contract on the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/exp_nonpositive.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STP_ACTIVATION_ROWS_SIMD_BUILT 1
#endif

namespace stp::activation_rows {

using i64 = std::int64_t;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

STP_HD inline float sigmoid(float x) {
  const float e = exp_nonpositive(x >= 0.0f ? -x : x);  // exp(-|x|), in (0, 1]
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

// The per-element formulas, shared by the plain runs below (the vector forms spell out the same
// operations on 8 lanes).
STP_HD inline float gelu_s(float v) { return sigmoid(2.0f * (kGeluC * (v + kGeluA * v * v * v))); }
STP_HD inline float gelu_value(float v) { return v * gelu_s(v); }
STP_HD inline float gelu_grad(float v, float d) {
  const float sg = gelu_s(v);
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
  return d * (sg + v * du * 2.0f * sg * (1.0f - sg));
}

#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT)
// The f32 vector forms (activation_rows_avx2.cpp), host code; used where simd_available().
bool simd_available();  // cpu_has_isa(CpuIsa::Avx2) (core/kernels/cpu_isa.h): AVX2 + FMA, allowed
void simd_gelu_run(float* y, const float* x, i64 n);
void simd_gelu_backward_run(float* dx, const float* dy, const float* x, i64 n);
void simd_swiglu_run(float* o, const float* g, const float* u, i64 n);
void simd_swiglu_backward_run(float* dg, float* du, const float* dy, const float* g, const float* u, i64 n);
#endif

// The plain runs (the reference the vector forms are tested against, and the CUDA and bf16 path).
template <typename T>
STP_HD inline void plain_gelu_run(T* y, const T* x, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = from_f32<T>(gelu_value(to_f32(x[i])));
}

template <typename T>
STP_HD inline void plain_gelu_backward_run(T* dx, const T* dy, const T* x, i64 n) {
  for (i64 i = 0; i < n; ++i) dx[i] = from_f32<T>(gelu_grad(to_f32(x[i]), to_f32(dy[i])));
}

template <typename T>
STP_HD inline void plain_swiglu_run(T* o, const T* g, const T* u, i64 n) {
  for (i64 j = 0; j < n; ++j) {
    const float gv = to_f32(g[j]);
    o[j] = from_f32<T>(gv * sigmoid(gv) * to_f32(u[j]));
  }
}

template <typename T>
STP_HD inline void plain_swiglu_backward_run(T* dg, T* du, const T* dy, const T* g, const T* u, i64 n) {
  for (i64 j = 0; j < n; ++j) {
    const float gv = to_f32(g[j]), uv = to_f32(u[j]), dv = to_f32(dy[j]), sg = sigmoid(gv);
    dg[j] = from_f32<T>(dv * uv * sg * (1.0f + gv * (1.0f - sg)));
    du[j] = from_f32<T>(dv * gv * sg);
  }
}

// The dispatching runs the kernels call: the vector form for f32 on the host where the CPU has it.
template <typename T>
STP_HD inline void gelu_run(T* y, const T* x, i64 n) {
#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_gelu_run(y, x, n);
#endif
  plain_gelu_run(y, x, n);
}

template <typename T>
STP_HD inline void gelu_backward_run(T* dx, const T* dy, const T* x, i64 n) {
#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_gelu_backward_run(dx, dy, x, n);
#endif
  plain_gelu_backward_run(dx, dy, x, n);
}

template <typename T>
STP_HD inline void swiglu_run(T* o, const T* g, const T* u, i64 n) {
#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_swiglu_run(o, g, u, n);
#endif
  plain_swiglu_run(o, g, u, n);
}

template <typename T>
STP_HD inline void swiglu_backward_run(T* dg, T* du, const T* dy, const T* g, const T* u, i64 n) {
#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    if (simd_available()) return simd_swiglu_backward_run(dg, du, dy, g, u, n);
#endif
  plain_swiglu_backward_run(dg, du, dy, g, u, n);
}

}  // namespace stp::activation_rows
