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
#include <vector>

#include "core/device.h"

namespace stp {

struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

// The per-step constants of one AdamW update (the element formula is at adamw_step).
struct AdamWScalars {
  float decay_factor;  // 1 - lr * weight_decay with decay, else 1
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;  // 1.0f - beta, in f32
  float step_size;                         // lr / (1 - beta1^step), bias correction in double
  float bias2_sqrt;                        // sqrt(1 - beta2^step), in double
  float eps;
};

// The constants of step `step` (1-based); the device kernel and the CPU AdamW both use these.
AdamWScalars adamw_scalars(float lr, const AdamWHyper& h, int step, bool decay);

// One AdamW step on n elements, torch.optim.AdamW semantics (step is 1-based, counting this one):
//   p *= 1 - lr * weight_decay                          (only if decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// Callers pass decay = (the parameter has two or more dimensions). m and v start at zero.
//
// Per element, in this order, in f32 with every product and sum rounded on its own (no fused
// multiply-add on the host compiler: the build compiles this file with -ffp-contract=off):
//   p' = p * decay_factor
//   m' = m * beta1 + g * one_minus_beta1
//   v' = v * beta2 + (g * g) * one_minus_beta2
//   p  = p' - step_size * (m' / (sqrt(v') / bias2_sqrt + eps))
// The formula is adamw_element (adamw_ranges.h); CPU streams run it through adamw_range's vector
// forms, which optim/cpu_adamw.h shares for host memory (bitwise equal results).
void adamw_step(Stream& s, float* param, const float* grad, float* m, float* v, std::size_t n, float lr,
                const AdamWHyper& h, int step, bool decay);

// ---- The fused pass over flat buffers ---------------------------------------------------------
//
// A flat run: parameters laid out back to back in one buffer each for p, g, m and v (a chunk's
// flat parameter and gradient buffers, ParamStore; the optimizer's flat moments), described by
// their element counts in order. adamw_flat_step updates the whole run in
// adamw_flat_launches(segments) launches: one per kMaxFlatSegments runs of adjacent segments
// with equal flags (decay, copy), at most 2^31 elements each — a GPT-2 layer is 8 such runs, a
// Llama layer 2 or 3 — instead of one launch per parameter (and one more per bf16 copy).
//
// Clipping is fused: with coef (a device scalar, clip_coefficient's), each gradient element is
// read as g * *coef, one f32 multiply — the bits scale_by_scalar would leave in g — and g itself
// is not written. So the result is bitwise adamw_step after scale_by_scalar, element by element.
//
// The bf16 copy is fused: a segment with `copy` also writes from_f32<bf16>(p) of each updated
// element into `copies`, the bf16 copies of the copy segments back to back in segment order —
// the bits convert (nn_kernels.h) would write, so the stage's refresh of them may be skipped.
struct FlatSegment {
  std::size_t count;  // elements
  bool decay;         // the parameter's weight decay (ParamInfo::decay)
  bool copy = false;  // write the bf16 copy of the updated elements
};

// Runs of equal flags per launch (they travel in the kernel's arguments).
constexpr int kMaxFlatSegments = 256;

std::size_t adamw_flat_launches(const std::vector<FlatSegment>& segments);

// One AdamW step (adamw_step's element formula) over a flat run, decay per segment; coef:
// null (no clipping) or a device scalar every gradient is multiplied by as it is read; copies:
// the copy segments' bf16 copies (null when no segment has copy).
void adamw_flat_step(Stream& s, float* param, const float* grad, float* m, float* v,
                     const std::vector<FlatSegment>& segments, float lr, const AdamWHyper& h, int step,
                     const float* coef, bf16* copies = nullptr);

// Elements per fixed block of the deterministic sum of squares.
constexpr std::size_t kSumSqBlock = 2048;

// Floats of workspace sumsq_accumulate needs for n elements: ceil(n / kSumSqBlock) (>= 1).
std::size_t sumsq_partials_count(std::size_t n);

// *acc += sum_i x[i]^2 over x (n,). partials: device workspace of sumsq_partials_count(n) floats
// (reusable by the next call on the same stream). acc: device scalar (1,).
void sumsq_accumulate(Stream& s, const float* x, std::size_t n, float* partials, float* acc);

// The same sum over several ranges of one buffer in a few launches (the fused pass's norm
// partials): ranges (offset, count) of x, in order, added to *acc exactly as one
// sumsq_accumulate per range in that order would add them — every range cut into its own blocks
// of kSumSqBlock elements (double sums, each rounded to f32), the block sums of a range added in
// block order in double, and *acc = f32(*acc + that sum), range after range — so the result is
// bitwise the per-tensor loop's. Per launch of kMaxFlatSegments ranges (spanning under 2^31
// elements): one launch computing every block sum, one adding them in that fixed order.
// partials: device workspace of sumsq_flat_partials_count(ranges) floats.
struct FlatRange {
  std::size_t offset, count;  // elements
};
std::size_t sumsq_flat_launches(const std::vector<FlatRange>& ranges);  // launches of both kinds
std::size_t sumsq_flat_partials_count(const std::vector<FlatRange>& ranges);
void sumsq_flat_accumulate(Stream& s, const float* x, const std::vector<FlatRange>& ranges, float* partials,
                           float* acc);

// From a (globally reduced) sum of squares, as torch.nn.utils.clip_grad_norm_:
//   *norm = sqrt(*sumsq);  *coef = min(1, max_norm / (*norm + 1e-6)).
// norm and coef are device scalars; norm may alias sumsq.
void clip_coefficient(Stream& s, const float* sumsq, float max_norm, float* norm, float* coef);

// x[i] *= *coef for x (n,); coef is a device scalar read by the kernel (no host round trip).
void scale_by_scalar(Stream& s, float* x, std::size_t n, const float* coef);

}  // namespace stp
