// Single-source optimizer kernels (compiled by nvcc when the CUDA backend is on).
#include "core/kernels/optim_kernels.h"

#include <cmath>

#include "core/launch.h"

namespace stp {
namespace {

// The order of operations follows torch's _single_tensor_adamw so results agree to rounding.
struct AdamWKernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  AdamWScalars c;
  STP_HD void operator()(std::size_t i) const {
    float gi = g[i];
    float pi = p[i] * c.decay_factor;
    float mi = m[i] * c.beta1 + gi * c.one_minus_beta1;
    float vi = v[i] * c.beta2 + (gi * gi) * c.one_minus_beta2;
    float denom = sqrtf(vi) / c.bias2_sqrt + c.eps;
    p[i] = pi - c.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
};

struct SumSqBlockKernel {  // one index per block of kSumSqBlock elements
  const float* x;
  std::size_t n;
  float* partials;
  STP_HD void operator()(std::size_t b) const {
    std::size_t begin = b * kSumSqBlock;
    std::size_t end = begin + kSumSqBlock < n ? begin + kSumSqBlock : n;
    double s = 0.0;
    for (std::size_t i = begin; i < end; ++i) s += double(x[i]) * double(x[i]);
    partials[b] = float(s);
  }
};

struct SumPartialsKernel {  // a single index: adds the block sums in block order
  const float* partials;
  std::size_t blocks;
  float* acc;
  STP_HD void operator()(std::size_t) const {
    double s = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) s += double(partials[b]);
    *acc = float(double(*acc) + s);
  }
};

struct ClipCoefKernel {
  const float* sumsq;
  float max_norm;
  float* norm;
  float* coef;
  STP_HD void operator()(std::size_t) const {
    float total = sqrtf(*sumsq);
    float c = max_norm / (total + 1e-6f);
    *norm = total;
    *coef = c < 1.0f ? c : 1.0f;
  }
};

struct ScaleKernel {
  float* x;
  const float* coef;
  STP_HD void operator()(std::size_t i) const { x[i] *= *coef; }
};

}  // namespace

AdamWScalars adamw_scalars(float lr, const AdamWHyper& h, int step, bool decay) {
  STP_ASSERT(step >= 1, "adamw_step: step is 1-based, got ", step);
  // Bias corrections in double, as torch computes them with Python floats.
  double bias1 = 1.0 - std::pow(double(h.beta1), step);
  double bias2 = 1.0 - std::pow(double(h.beta2), step);
  return AdamWScalars{decay ? float(1.0 - double(lr) * double(h.weight_decay)) : 1.0f,
                      h.beta1,
                      h.beta2,
                      1.0f - h.beta1,
                      1.0f - h.beta2,
                      float(double(lr) / bias1),
                      float(std::sqrt(bias2)),
                      h.eps};
}

void adamw_step(Stream& s, float* param, const float* grad, float* m, float* v, std::size_t n, float lr,
                const AdamWHyper& h, int step, bool decay) {
  launch(s, n, AdamWKernel{param, grad, m, v, adamw_scalars(lr, h, step, decay)});
}

std::size_t sumsq_partials_count(std::size_t n) { return n == 0 ? 1 : (n + kSumSqBlock - 1) / kSumSqBlock; }

void sumsq_accumulate(Stream& s, const float* x, std::size_t n, float* partials, float* acc) {
  if (n == 0) return;
  std::size_t blocks = sumsq_partials_count(n);
  launch(s, blocks, SumSqBlockKernel{x, n, partials}, 4);
  launch(s, 1, SumPartialsKernel{partials, blocks, acc}, 1);
}

void clip_coefficient(Stream& s, const float* sumsq, float max_norm, float* norm, float* coef) {
  launch(s, 1, ClipCoefKernel{sumsq, max_norm, norm, coef}, 1);
}

void scale_by_scalar(Stream& s, float* x, std::size_t n, const float* coef) { launch(s, n, ScaleKernel{x, coef}); }

}  // namespace stp
