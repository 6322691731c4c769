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
  for (const ParamInfo& p : params_)
    STP_ASSERT(p.param.defined() && p.grad.defined() && p.param.shape() == p.grad.shape() &&
                   p.param.dtype() == DType::F32 && p.grad.dtype() == DType::F32,
               "AdamW: parameter ", p.name, " needs f32 param and grad of one shape");
  // The device parameters' flat runs: a parameter continues the run when it is in the same group
  // and its param and grad start where the previous ones end.
  auto group = [&](std::size_t i) { return param_group.empty() ? 0 : param_group[i]; };
  // A parameter with a bf16 GEMM copy (ParamInfo::compute) has it written by the update too; the
  // run's copies must then lie back to back as well.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (on_host_[i]) continue;
    const ParamInfo& p = params_[i];
    const bool copy = p.compute.defined() && p.compute.dtype() == DType::Bf16;
    bool continues = !runs_.empty() && runs_.back().end == i && group(i - 1) == group(i) &&
                     params_[i - 1].param.f32() + params_[i - 1].param.numel() == p.param.f32() &&
                     params_[i - 1].grad.f32() + params_[i - 1].grad.numel() == p.grad.f32();
    if (continues && copy && runs_.back().copies)
      continues = runs_.back().copies + runs_.back().copied == p.compute.as<bf16>();
    if (!continues) runs_.push_back(Run{i, i, {}, {}, {}, nullptr, 0});
    Run& r = runs_.back();
    r.end = i + 1;
    r.segments.push_back(FlatSegment{static_cast<std::size_t>(p.param.numel()), p.decay, copy});
    if (!copy) continue;
    if (!r.copies) r.copies = p.compute.as<bf16>();
    r.copied += static_cast<std::size_t>(p.param.numel());
  }
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  {
    MaybeCategoryScope as(alloc, MemoryCategory::OptimizerState);
    for (Run& r : runs_) {
      std::int64_t n = 0;
      for (const FlatSegment& sg : r.segments) n += static_cast<std::int64_t>(sg.count);
      r.m = Tensor::empty(alloc, Shape{n});
      r.v = Tensor::empty(alloc, Shape{n});
      s.zero(r.m.raw(), r.m.bytes());
      s.zero(r.v.raw(), r.v.bytes());
      std::int64_t at = 0;
      for (std::size_t i = r.first; i < r.end; ++i) {
        exp_avg_[i] = r.m.view(at, params_[i].param.shape());
        exp_avg_sq_[i] = r.v.view(at, params_[i].param.shape());
        at += params_[i].param.numel();
      }
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!on_host_[i]) continue;
    exp_avg_[i] = Tensor::empty(host->allocator(), params_[i].param.shape());
    exp_avg_sq_[i] = Tensor::empty(host->allocator(), params_[i].param.shape());
    s.zero(exp_avg_[i].raw(), exp_avg_[i].bytes());
    s.zero(exp_avg_sq_[i].raw(), exp_avg_sq_[i].bytes());
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

void AdamW::step(Stream& s, float lr, const float* coef) {
  STP_ASSERT(params_.size() == exp_avg_.size(), "AdamW: the parameter list changed size");
  ++step_count_;
  for (Run& r : runs_)
    adamw_flat_step(s, params_[r.first].param.f32(), params_[r.first].grad.f32(), r.m.f32(), r.v.f32(), r.segments, lr,
                    hyper_, static_cast<int>(step_count_), coef, r.copies);
  if (host_) {
    STP_ASSERT(&s == &host_->compute(), "AdamW: an offloaded update orders the stream it was built with");
    host_->step(lr, hyper_, static_cast<int>(step_count_));
  }
}

std::vector<bool> AdamW::device_updated() const {
  std::vector<bool> out(params_.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = !on_host_[i];
  return out;
}

std::size_t AdamW::device_launches() const {
  std::size_t n = 0;
  for (const Run& r : runs_) n += adamw_flat_launches(r.segments);
  return n;
}

}  // namespace stp
