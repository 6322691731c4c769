// Global-norm clipping (torch.nn.utils.clip_grad_norm_ semantics) over gradients spread across
// ranks; the usage with AdamW is in optim/adamw.h. All math is stream work (optim_kernels.h).
//
// The gradients are walked as flat runs: consecutive parameters (in list order) whose gradients
// lie back to back in memory (a chunk's flat gradient buffer, ParamStore) form one run, and each
// run's counted gradients are summed by sumsq_flat_accumulate in a few launches. The order of
// the sum is fixed and the same for every mechanism (replicated, offloaded, distributed): each
// counted gradient, in list order, is cut into blocks of kSumSqBlock elements summed in double
// and rounded to f32; a gradient's block sums are added in block order in double, and that sum
// is added to the f32 accumulator (one rounding per gradient). It is bitwise the per-tensor
// sumsq_accumulate loop, however the gradients are grouped into runs and launches.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/kernels/optim_kernels.h"
#include "core/tensor.h"
#include "models/stage.h"

namespace stp {

class GradClipper {
 public:
  // counted(p): whether p's grad enters this rank's sum of squares. Count each distinct gradient
  // once over all ranks: a replicated tensor only on TP rank 0, a tied copy only in one stage.
  // Default: every parameter counts (a single rank).
  GradClipper(std::vector<ParamInfo>& params, Allocator& alloc,
              std::function<bool(const ParamInfo&)> counted = nullptr);

  // Which gradients clip() scales in place ([param], default every one). A gradient left out is
  // the caller's to scale: the fused AdamW (adamw_flat_step) reads it times coef().
  void set_scaled(std::vector<bool> scaled);

  // Zeroes sumsq() and adds the squares of the counted grads (deterministic, the order above).
  void local_sumsq(Stream& s);
  // Device scalar (1,): the caller all-reduces it (sum) across ranks between the two calls.
  float* sumsq() { return scalars_ + 0; }
  // norm = sqrt(sumsq); coef = min(1, max_norm / (norm + 1e-6)); every scaled grad *= coef.
  void clip(Stream& s, float max_norm);
  // Device scalars (1,), valid once clip()'s work has run: the global norm before clipping and
  // the applied coefficient.
  const float* norm() const { return scalars_ + 1; }
  const float* coef() const { return scalars_ + 2; }

  // Stream operations local_sumsq enqueues (the zero and the flat sums' launches).
  std::size_t sumsq_launches() const;

 private:
  struct Run {  // a flat run: params [first, end) with back-to-back gradients
    std::size_t first, end;
    std::vector<FlatRange> counted;  // the counted gradients, from params[first].grad
  };
  std::vector<ParamInfo>& params_;
  std::vector<bool> counted_, scaled_;
  std::vector<Run> runs_;
  Tensor workspace_;  // [3 scalars | partials]
  float* scalars_ = nullptr;
  float* partials_ = nullptr;
};

}  // namespace stp
