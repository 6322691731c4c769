// Global-norm clipping (torch.nn.utils.clip_grad_norm_ semantics) over gradients spread across
// ranks; the usage with AdamW is in optim/adamw.h. All math is stream work (optim_kernels.h).
#pragma once

#include <functional>
#include <vector>

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

  // Zeroes sumsq() and adds the squares of the counted grads (deterministic, optim_kernels.h).
  void local_sumsq(Stream& s);
  // Device scalar (1,): the caller all-reduces it (sum) across ranks between the two calls.
  float* sumsq() { return scalars_ + 0; }
  // norm = sqrt(sumsq); coef = min(1, max_norm / (norm + 1e-6)); every grad (counted or not) *= coef.
  void clip(Stream& s, float max_norm);
  // Device scalars (1,), valid once clip()'s work has run: the global norm before clipping and
  // the applied coefficient.
  const float* norm() const { return scalars_ + 1; }
  const float* coef() const { return scalars_ + 2; }

 private:
  std::vector<ParamInfo>& params_;
  std::vector<bool> counted_;
  Tensor workspace_;  // [3 scalars | partials]
  float* scalars_ = nullptr;
  float* partials_ = nullptr;
};

}  // namespace stp
