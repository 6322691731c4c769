#include "optim/host_update.h"

#include "base/error.h"
#include "base/trace_names.h"
#include "core/dtype.h"
#include "optim/cpu_adamw.h"

namespace stp {
namespace {

// The device convert kernel's rounding (from_f32<bf16>, core/dtype.h), split as cpu_adamw_update is.
void round_to_bf16(bf16* y, const float* x, std::size_t n) {
  for_cpu_blocks(n, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) y[i] = from_f32<bf16>(x[i]);
  });
}

}  // namespace

HostUpdate::HostUpdate(Device& device, Stream& compute, std::size_t groups, bool dry)
    : compute_(compute),
      d2h_(device.create_stream(trace::stream::kOptimizerD2h)),
      h2d_(device.create_stream(trace::stream::kOptimizerH2d)),
      cpu_(device.create_stream(trace::stream::kOptimizerCpu)),
      ready_(device.create_event()),
      groups_(groups),
      host_(device, host_bytes_),
      dry_(dry) {
  for (Group& g : groups_) {
    g.final = device.create_event();
    g.down = device.create_event();
    g.updated = device.create_event();
    g.up = device.create_event();
  }
}

HostUpdate::~HostUpdate() {
  // A failed stream has reported its error to whoever synchronized it first; here only the wait
  // matters, so no task outlives the buffers it reads.
  for (Stream* s : {cpu_.get(), h2d_.get(), d2h_.get()}) {
    try {
      s->synchronize();
    } catch (...) {}
  }
}

void HostUpdate::add(std::size_t group, float* param, const float* grad, float* m, float* v, std::size_t n, bool decay,
                     bf16* compute) {
  STP_ASSERT(!staged_, "HostUpdate: a span added after the first step");
  STP_ASSERT(group < groups_.size(), "HostUpdate: group ", group, " of ", groups_.size());
  Group& g = groups_[group];
  std::size_t& p_at = compute ? g.host_masters : g.device_masters;
  g.spans.push_back(Span{param, grad, m, v, compute, n, g.elements, p_at, decay});
  g.elements += n;
  p_at += n;
}

void HostUpdate::allocate_staging() {
  for (Group& g : groups_) {
    if (g.elements == 0) continue;
    if (g.device_masters > 0) g.p_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.device_masters)});
    g.g_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.elements)});
    if (g.host_masters > 0)
      g.c_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.host_masters)}, DType::Bf16);
  }
  staged_ = true;
}

void HostUpdate::begin_step() {
  if (!staged_) allocate_staging();
  // A skipped step's early downloads were never waited for: this step's work must not write the
  // gradients they read before they are done.
  order_after_downloads(compute_);
  for (Group& g : groups_) g.downloaded = false;
  coef_ = 1.0f;
}

// Staging is free to overwrite once the previous step's upload from it is done: compute waited
// for it (params_needed) before the work this stream waits for, and if it did not, this stream
// waits for the upload itself.
void HostUpdate::download(Group& g) {
  if (g.pending) d2h_->wait(*g.up);
  const std::size_t i = static_cast<std::size_t>(&g - groups_.data());
  d2h_->trace_begin(str("download group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
  for (const Span& s : g.spans) {
    if (!s.compute) d2h_->copy(g.p_host.f32() + s.p_at, s.param, s.n * sizeof(float));
    d2h_->copy(g.g_host.f32() + s.at, s.grad, s.n * sizeof(float));
  }
  d2h_->trace_end();
  d2h_->record(*g.down);
  g.downloaded = true;
}

void HostUpdate::order_after_downloads(Stream& s) {
  for (Group& g : groups_)
    if (g.downloaded) s.wait(*g.down);
}

void HostUpdate::grads_final(std::size_t group) {
  Group& g = groups_.at(group);
  if (!g.early || g.downloaded || !staged_) return;
  compute_.record(*g.final);
  d2h_->wait(*g.final);
  download(g);
}

void HostUpdate::step(float lr, const AdamWHyper& hyper, int step) {
  const float coef = coef_;
  if (!staged_) allocate_staging();
  // The groups not downloaded early: parameters and clipped gradients, after compute's work so far.
  compute_.record(*ready_);
  d2h_->wait(*ready_);
  std::vector<bool> scale(groups_.size());
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    scale[i] = groups_[i].downloaded && coef != 1.0f;  // an early copy holds the unclipped gradient
    if (!groups_[i].downloaded) download(groups_[i]);
  }
  // The CPU update of group g on the cpu stream once its download is done, while later groups
  // download and earlier ones upload; the host thread only enqueues (the arithmetic may still be
  // running when the next step starts enqueueing). Everything the task reads is either captured by
  // value or stays unchanged until its upload is done (download waits for it before overwriting
  // the staging; settle waits for every upload).
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    cpu_->wait(*g.down);
    if (!dry_) {
      cpu_->trace_begin(str("update group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
      cpu_->enqueue_host([&g, rescale = static_cast<bool>(scale[i]), coef, lr, hyper, step] {
        if (rescale) {
          float* x = g.g_host.f32();
          for (std::size_t k = 0; k < g.elements; ++k) x[k] *= coef;
        }
        for (const Span& s : g.spans) {
          float* p = s.compute ? s.param : g.p_host.f32() + s.p_at;
          cpu_adamw_update(p, g.g_host.f32() + s.at, s.m, s.v, s.n, adamw_scalars(lr, hyper, step, s.decay));
          if (s.compute) round_to_bf16(g.c_host.as<bf16>() + s.p_at, p, s.n);
        }
      });
      cpu_->trace_end();
    }
    cpu_->record(*g.updated);
    h2d_->wait(*g.updated);
    h2d_->trace_begin(str("upload group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
    for (const Span& s : g.spans) {
      if (s.compute) h2d_->copy(s.compute, g.c_host.as<bf16>() + s.p_at, s.n * sizeof(bf16));
      else h2d_->copy(s.param, g.p_host.f32() + s.p_at, s.n * sizeof(float));
    }
    h2d_->trace_end();
    h2d_->record(*g.up);
    g.pending = true;
  }
}

void HostUpdate::params_needed(std::size_t group) {
  Group& g = groups_.at(group);
  if (!g.pending) return;
  compute_.wait(*g.up);
  g.pending = false;
}

void HostUpdate::settle() {
  cpu_->synchronize();
  h2d_->synchronize();
  for (Group& g : groups_) g.pending = false;
}

}  // namespace stp
