// exp(x) for x <= 0, single source for CPU and CUDA: the exponential of every softmax here
// (attention scores, cross-entropy rows), whose argument is always a value minus a maximum or a
// log-sum-exp, and of the sigmoid of GELU and SwiGLU (exp(-|x|), activation_rows.h). Its 8-lane
// form for the CPU vector paths is exp_v in simd_v8.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

// exp_reduced is always inlined: the vector paths call it with 8-lane vectors from AVX2 functions,
// and an out-of-line copy (unoptimised builds do not inline otherwise) compiled without AVX would
// pass those vectors differently from its AVX callers (simd_v8.h).
#if defined(__CUDACC__)
#define STP_EXP_INLINE __forceinline__
#else
#define STP_EXP_INLINE inline __attribute__((always_inline))
#endif

namespace stp {

// The constants and the polynomial both forms share (scalar here, 8 lanes in simd_v8.h): x / ln 2,
// ln 2 split in two (Cody-Waite: the high part has few enough bits that n * kLn2Hi is exact for
// |n| < 2^8), and exp(r) for |r| <= ln2 / 2 as a degree-6 polynomial (the Cephes expf
// coefficients), Horner from the highest degree. F is float or an 8-lane float vector.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
// (GCC notes that an 8-lane vector return changes the ABI without AVX; always inlined, no vector
// crosses a call.)
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
template <typename F>
STP_HD STP_EXP_INLINE F exp_reduced(F r) {
  F y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  return y * r * r + r + 1.0f;
}
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC diagnostic pop
#endif

// exp(x) for x <= 0 (every exponent here is a score minus a running max or a log-sum-exp), as
// straight-line arithmetic the compiler vectorises (a libm expf call is one element at a time):
// x = n ln2 + r with ln2 split in two (Cody-Waite, exact products for |n| < 2^8), a degree-6
// polynomial for exp(r) on |r| <= ln2 / 2 (the Cephes expf coefficients: relative error below
// 2^-23), and 2^n put into the exponent bits. Below -87, where exp(x) < 2^-125, it returns
// exp(-87) ~ 1.6e-38 instead of a denormal: 0 to f32 working precision against any real weight.
STP_HD inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float fx = x * kLog2e;                     // x / ln 2
  int n = static_cast<int>(fx);                    // truncates towards zero: floor for x <= 0 ...
  n -= static_cast<float>(n) > fx ? 1 : 0;         // ... once the non-integers below are moved down
  n += fx - static_cast<float>(n) > 0.5f ? 1 : 0;  // round to nearest: |r| <= ln2 / 2
  const float nf = static_cast<float>(n);
  const float r = (x - nf * kLn2Hi) - nf * kLn2Lo;
  return exp_reduced(r) * bits_float(static_cast<std::uint32_t>(n + 127) << 23);
}

}  // namespace stp
