// Optimizer kernels, written once for both backends (core/launch.h): the AdamW update and the
// pieces of global-norm gradient clipping. All of them are enqueued on a stream and read/write
// device memory only; nothing here waits for the device or copies to the host.
//
// Global-norm clipping across ranks (torch.nn.utils.clip_grad_norm_ semantics), per step:
//
//   stream.zero(sumsq, 4);                                         // device scalar (1,)
//   for each gradient g this rank owns:                            // count replicated ones once
//     sumsq_accumulate(s, g, n, partials, sumsq);                  // sumsq += sum(g*g)
//   comm.all_reduce_sum(s, sumsq, 1);                              // caller: over TP/PP/DP ranks
//   clip_coefficient(s, sumsq, max_norm, norm, coef);              // norm = sqrt(sumsq)
//   for each gradient g: scale_by_scalar(s, g, n, coef);           // g *= coef
//
// The sum of squares is deterministic: [0, n) is cut into fixed blocks of kSumSqBlock elements,
// each block is summed in index order (double accumulator), and the block sums are added in
// block order by one thread, so the result does not depend on the thread count or the backend's
// scheduling.
#pragma once

#include <cstddef>

#include "core/device.h"

namespace stp {

struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

// One AdamW step on n elements, torch.optim.AdamW semantics (step is 1-based, counting this one):
//   p *= 1 - lr * weight_decay                          (only if decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// Callers pass decay = (the parameter has two or more dimensions). m and v start at zero.
void adamw_step(Stream& s, float* param, const float* grad, float* m, float* v, std::size_t n, float lr,
                const AdamWHyper& h, int step, bool decay);

// Elements per fixed block of the deterministic sum of squares.
constexpr std::size_t kSumSqBlock = 2048;

// Floats of workspace sumsq_accumulate needs for n elements: ceil(n / kSumSqBlock) (>= 1).
std::size_t sumsq_partials_count(std::size_t n);

// *acc += sum_i x[i]^2 over x (n,). partials: device workspace of sumsq_partials_count(n) floats
// (reusable by the next call on the same stream). acc: device scalar (1,).
void sumsq_accumulate(Stream& s, const float* x, std::size_t n, float* partials, float* acc);

// From a (globally reduced) sum of squares, as torch.nn.utils.clip_grad_norm_:
//   *norm = sqrt(*sumsq);  *coef = min(1, max_norm / (*norm + 1e-6)).
// norm and coef are device scalars; norm may alias sumsq.
void clip_coefficient(Stream& s, const float* sumsq, float max_norm, float* norm, float* coef);

// x[i] *= *coef for x (n,); coef is a device scalar read by the kernel (no host round trip).
void scale_by_scalar(Stream& s, float* x, std::size_t n, const float* coef);

}  // namespace stp
