#include "optim/grad_clipper.h"

#include <algorithm>

#include "core/kernels/optim_kernels.h"
#include "memory/block_arena.h"

namespace stp {

GradClipper::GradClipper(std::vector<ParamInfo>& params, Allocator& alloc,
                         std::function<bool(const ParamInfo&)> counted)
    : params_(params) {
  std::size_t partials = 1;
  for (const ParamInfo& p : params_) {
    counted_.push_back(!counted || counted(p));
    partials = std::max(partials, sumsq_partials_count(static_cast<std::size_t>(p.grad.numel())));
  }
  MaybeCategoryScope as(alloc, MemoryCategory::Buffers);
  workspace_ = Tensor::empty(alloc, Shape{static_cast<std::int64_t>(3 + partials)});
  scalars_ = workspace_.f32();
  partials_ = scalars_ + 3;
}

void GradClipper::local_sumsq(Stream& s) {
  s.zero(scalars_, sizeof(float));
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (counted_[i])
      sumsq_accumulate(s, params_[i].grad.f32(), static_cast<std::size_t>(params_[i].grad.numel()), partials_,
                       scalars_);
}

void GradClipper::clip(Stream& s, float max_norm) {
  STP_ASSERT(max_norm > 0, "GradClipper: max_norm must be > 0 (grad_clip 0 = no clipping: skip the clipper)");
  clip_coefficient(s, scalars_, max_norm, scalars_ + 1, scalars_ + 2);
  for (ParamInfo& p : params_) scale_by_scalar(s, p.grad.f32(), static_cast<std::size_t>(p.grad.numel()), scalars_ + 2);
}

}  // namespace stp
