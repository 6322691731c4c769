#include "optim/adamw.h"

#include <algorithm>

#include "memory/block_arena.h"
#include "config/config.h"
#include "base/error.h"

namespace stp {

AdamWHyper adamw_hyper(const OptimConfig& o) {
  return AdamWHyper{float(o.beta1), float(o.beta2), float(o.eps), float(o.weight_decay)};
}

AdamW::AdamW(std::vector<ParamInfo>& params, const AdamWHyper& hyper, Allocator& alloc, Stream& s, HostUpdate* host,
             const std::vector<int>& param_group, const std::vector<bool>& host_groups)
    : params_(params), hyper_(hyper), host_(host), on_host_(params.size(), false) {
  STP_ASSERT(!host || param_group.size() == params.size(), "AdamW: a group for every parameter");
  for (std::size_t i = 0; host && i < params_.size(); ++i) {
    const auto g = static_cast<std::size_t>(param_group[i]);
    STP_ASSERT(host_groups.empty() || g < host_groups.size(), "AdamW: group ", g, " of ", host_groups.size());
    on_host_[i] = host_groups.empty() || host_groups[g];
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    STP_ASSERT(p.param.defined() && p.grad.defined() && p.param.shape() == p.grad.shape() &&
                   p.param.dtype() == DType::F32 && p.grad.dtype() == DType::F32,
               "AdamW: parameter ", p.name, " needs f32 param and grad of one shape");
    Allocator& state = on_host_[i] ? host->allocator() : alloc;
    MaybeCategoryScope as(alloc, MemoryCategory::OptimizerState);
    exp_avg_.push_back(Tensor::empty(state, p.param.shape()));
    exp_avg_sq_.push_back(Tensor::empty(state, p.param.shape()));
    s.zero(exp_avg_.back().raw(), exp_avg_.back().bytes());
    s.zero(exp_avg_sq_.back().raw(), exp_avg_sq_.back().bytes());
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    STP_ASSERT(on_host_[i] || !p.host_master, "AdamW: parameter ", p.name,
               " has its master on the host but its optimizer on the device");
    if (on_host_[i])
      host->add(static_cast<std::size_t>(param_group[i]), p.param.f32(), p.grad.f32(), exp_avg_[i].f32(),
                exp_avg_sq_[i].f32(), static_cast<std::size_t>(p.param.numel()), p.decay,
                p.host_master ? p.compute.as<bf16>() : nullptr);
  }
}

void AdamW::step(Stream& s, float lr) {
  STP_ASSERT(params_.size() == exp_avg_.size(), "AdamW: the parameter list changed size");
  ++step_count_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (on_host_[i]) continue;
    ParamInfo& p = params_[i];
    adamw_step(s, p.param.f32(), p.grad.f32(), exp_avg_[i].f32(), exp_avg_sq_[i].f32(),
               static_cast<std::size_t>(p.param.numel()), lr, hyper_, static_cast<int>(step_count_), p.decay);
  }
  if (host_) {
    STP_ASSERT(&s == &host_->compute(), "AdamW: an offloaded update orders the stream it was built with");
    host_->step(lr, hyper_, static_cast<int>(step_count_));
  }
}

}  // namespace stp
