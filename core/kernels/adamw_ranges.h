// AdamW's element formula, single source (adamw_element: the device kernel of
// core/kernels/optim_kernels.cpp runs it per GPU thread), and the host loop over a range of it with
// a vector instruction set (adamw_range, defined in adamw_ranges.cpp, compiled by the host compiler
// only; the set is the caller's choice, best_cpu_isa() of core/kernels/cpu_isa.h), shared by the CPU backend's
// adamw_step on its streams and the CPU optimizer of host-resident state (optim/cpu_adamw.h).
//
// Every form runs adamw_element's operations in its order, each rounded on its own: separate
// multiply, add, divide and square-root instructions (IEEE correctly rounded in every instruction
// set), and adamw_ranges.cpp is compiled with -ffp-contract=off. So every element gets the same bits
// whatever the instruction set, the split into ranges or the thread that runs it.
#pragma once

#include <cmath>
#include <cstddef>

#include "core/dtype.h"
#include "core/kernels/cpu_isa.h"
#include "core/kernels/optim_kernels.h"

namespace stp {

// The element formula of adamw_step (optim_kernels.h), in torch's _single_tensor_adamw order.
STP_HD inline void adamw_element(float* p, const float* g, float* m, float* v, std::size_t i, const AdamWScalars& c) {
  float gi = g[i];
  float pi = p[i] * c.decay_factor;
  float mi = m[i] * c.beta1 + gi * c.one_minus_beta1;
  float vi = v[i] * c.beta2 + (gi * gi) * c.one_minus_beta2;
  float denom = sqrtf(vi) / c.bias2_sqrt + c.eps;
  p[i] = pi - c.step_size * (mi / denom);
  m[i] = mi;
  v[i] = vi;
}

// adamw_element with the gradient read as g[i] * gscale (the fused clipping of adamw_flat_step,
// optim_kernels.h): one f32 multiply, the bits an in-place scaling of g would leave.
STP_HD inline void adamw_element_scaled(float* p, const float* g, float* m, float* v, std::size_t i,
                                        const AdamWScalars& c, float gscale) {
  float gi = g[i] * gscale;
  float pi = p[i] * c.decay_factor;
  float mi = m[i] * c.beta1 + gi * c.one_minus_beta1;
  float vi = v[i] * c.beta2 + (gi * gi) * c.one_minus_beta2;
  float denom = sqrtf(vi) / c.bias2_sqrt + c.eps;
  p[i] = pi - c.step_size * (mi / denom);
  m[i] = mi;
  v[i] = vi;
}

// adamw_element for every i in [begin, end), 16 or 8 lanes at a time with `isa` (one cpu_has_isa
// accepts; the caller checks), the scalar formula for the tail.
void adamw_range(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                 const AdamWScalars& c);
// The same with adamw_element_scaled's gradient scaling.
void adamw_range_scaled(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                        const AdamWScalars& c, float gscale);

}  // namespace stp
