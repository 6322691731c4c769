// 8-lane float vectors (GCC vector extensions) for the CPU vector paths of the kernels
// (attention_kernels_avx2.cpp, softmax_rows_avx2.cpp, activation_rows_avx2.cpp): host code for GCC
// on x86-64 only, included by files whose callers are compiled for AVX2 + FMA (`target("avx2,fma"),
// flatten`), so every helper here is inlined and each vector is one ymm register. Never seen by nvcc.
#pragma once

#if !defined(__GNUC__) || defined(__clang__) || !defined(__x86_64__) || defined(__CUDACC__)
#error "simd_v8.h is for GCC host builds on x86-64"
#endif

#include <cstdint>

#include "core/kernels/exp_nonpositive.h"

// Every helper is always inlined into its AVX2 caller, so no vector ever crosses a call boundary;
// GCC's note that a 32-byte vector return changes the ABI without AVX does not apply (GCC reports
// it where the templates are instantiated, at the end of the including file, so it stays off for
// the whole of it). `always_inline`, not plain `inline`: an unoptimised build (the sanitizer
// builds) does not inline otherwise, even into a `flatten` caller, and an out-of-line helper
// compiled without AVX returns its vector in memory while the AVX caller reads it from a
// register. `static`: each including file has its own copy, never merged with another's.
#pragma GCC diagnostic ignored "-Wpsabi"

#define STP_V8_INLINE static inline __attribute__((always_inline))

namespace stp::simd_v8 {

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));  // unaligned loads and stores
typedef std::int32_t i8 __attribute__((vector_size(32)));

STP_V8_INLINE v8 vload(const float* p) { return *reinterpret_cast<const v8u*>(p); }
STP_V8_INLINE void vstore(float* p, v8 x) { *reinterpret_cast<v8u*>(p) = x; }
STP_V8_INLINE v8 vsplat(float x) { return v8{} + x; }

// exp_nonpositive (exp_nonpositive.h) on 8 lanes: the same steps (clamp, Cody-Waite reduction, the
// degree-6 polynomial, 2^n through the exponent bits). A comparison yields -1 per true lane, so
// `n += c` subtracts one where c holds.
STP_V8_INLINE v8 exp_v(v8 x) {
  x = x < vsplat(-87.0f) ? vsplat(-87.0f) : x;
  const v8 fx = x * kLog2e;
  i8 n = __builtin_convertvector(fx, i8);
  n += __builtin_convertvector(n, v8) > fx;
  n -= fx - __builtin_convertvector(n, v8) > vsplat(0.5f);
  const v8 nf = __builtin_convertvector(n, v8);
  const v8 r = (x - nf * kLn2Hi) - nf * kLn2Lo;
  return exp_reduced(r) * (v8)((n + 127) << 23);
}

}  // namespace stp::simd_v8
