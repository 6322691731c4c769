#include "optim/grad_clipper.h"

#include <algorithm>

#include "base/error.h"
#include "memory/block_arena.h"

namespace stp {

GradClipper::GradClipper(std::vector<ParamInfo>& params, Allocator& alloc,
                         std::function<bool(const ParamInfo&)> counted)
    : params_(params), scaled_(params.size(), true) {
  for (const ParamInfo& p : params_) counted_.push_back(!counted || counted(p));
  // Runs: a parameter continues the run when its gradient starts where the previous one ends.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const float* g = params_[i].grad.f32();
    if (runs_.empty() || params_[i - 1].grad.f32() + params_[i - 1].grad.numel() != g) runs_.push_back(Run{i, i, {}});
    Run& r = runs_.back();
    r.end = i + 1;
    if (counted_[i])
      r.counted.push_back(FlatRange{static_cast<std::size_t>(g - params_[r.first].grad.f32()),
                                    static_cast<std::size_t>(params_[i].grad.numel())});
  }
  std::size_t partials = 1;
  for (const Run& r : runs_) partials = std::max(partials, sumsq_flat_partials_count(r.counted));
  MaybeCategoryScope as(alloc, MemoryCategory::Buffers);
  workspace_ = Tensor::empty(alloc, Shape{static_cast<std::int64_t>(3 + partials)});
  scalars_ = workspace_.f32();
  partials_ = scalars_ + 3;
}

void GradClipper::set_scaled(std::vector<bool> scaled) {
  STP_ASSERT(scaled.size() == params_.size(), "GradClipper: ", scaled.size(), " flags for ", params_.size(),
             " parameters");
  scaled_ = std::move(scaled);
}

void GradClipper::local_sumsq(Stream& s) {
  s.zero(scalars_, sizeof(float));
  for (const Run& r : runs_) sumsq_flat_accumulate(s, params_[r.first].grad.f32(), r.counted, partials_, scalars_);
}

std::size_t GradClipper::sumsq_launches() const {
  std::size_t n = 1;
  for (const Run& r : runs_) n += sumsq_flat_launches(r.counted);
  return n;
}

void GradClipper::clip(Stream& s, float max_norm) {
  STP_ASSERT(max_norm > 0, "GradClipper: max_norm must be > 0 (grad_clip 0 = no clipping: skip the clipper)");
  clip_coefficient(s, scalars_, max_norm, scalars_ + 1, scalars_ + 2);
  // One scaling per stretch of back-to-back scaled gradients.
  for (std::size_t i = 0; i < params_.size();) {
    if (!scaled_[i]) {
      ++i;
      continue;
    }
    float* begin = params_[i].grad.f32();
    std::size_t n = 0;
    for (; i < params_.size() && scaled_[i] && params_[i].grad.f32() == begin + n; ++i)
      n += static_cast<std::size_t>(params_[i].grad.numel());
    scale_by_scalar(s, begin, n, scalars_ + 2);
  }
}

}  // namespace stp
