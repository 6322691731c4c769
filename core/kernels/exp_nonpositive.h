// exp(x) for x <= 0, single source for CPU and CUDA: the exponential of every softmax here
// (attention scores, cross-entropy rows), whose argument is always a value minus a maximum or a
// log-sum-exp. Its 8-lane form for the CPU vector paths is exp_v in simd_v8.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace stp {

// exp(x) for x <= 0 (every exponent here is a score minus a running max or a log-sum-exp), as
// straight-line arithmetic the compiler vectorises (a libm expf call is one element at a time):
// x = n ln2 + r with ln2 split in two (Cody-Waite, exact products for |n| < 2^8), a degree-6
// polynomial for exp(r) on |r| <= ln2 / 2 (the Cephes expf coefficients: relative error below
// 2^-23), and 2^n put into the exponent bits. Below -87, where exp(x) < 2^-125, it returns
// exp(-87) ~ 1.6e-38 instead of a denormal: 0 to f32 working precision against any real weight.
STP_HD inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float fx = x * 1.44269504088896341f;       // x / ln 2
  int n = static_cast<int>(fx);                    // truncates towards zero: floor for x <= 0 ...
  n -= static_cast<float>(n) > fx ? 1 : 0;         // ... once the non-integers below are moved down
  n += fx - static_cast<float>(n) > 0.5f ? 1 : 0;  // round to nearest: |r| <= ln2 / 2
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * bits_float(static_cast<std::uint32_t>(n + 127) << 23);
}

}  // namespace stp
