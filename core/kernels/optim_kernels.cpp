// Single-source optimizer kernels (compiled by nvcc when the CUDA backend is on).
#include "core/kernels/optim_kernels.h"

#include <cmath>
#include <cstdint>

#include "core/kernels/adamw_ranges.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

// One task per run of elements (an element-wise launch): a CPU run of kAdamWRun goes through
// adamw_range with the widest vector instruction set (bitwise adamw_element, adamw_ranges.h); runs of
// one element (the GPU layout) are the element formula itself.
constexpr std::int64_t kAdamWRun = 8192;

struct AdamWKernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  ElementRuns runs;
  AdamWScalars c;
  STP_HD void operator()(std::size_t r) const {
    const ElementRuns::Part part = runs.part(r);
    const auto begin = static_cast<std::size_t>(part.begin), end = static_cast<std::size_t>(part.begin + part.size);
#if !defined(__CUDA_ARCH__)
    if (runs.run > 1) return adamw_range(best_cpu_isa(), p, g, m, v, begin, end, c);
#endif
    for (std::size_t i = begin; i < end; ++i) adamw_element(p, g, m, v, i, c);
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
  const ElementRuns runs = element_wise(s, static_cast<std::int64_t>(n), kAdamWRun);
  launch(s, runs, AdamWKernel{param, grad, m, v, runs, adamw_scalars(lr, h, step, decay)}, runs.grain(32768));
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
