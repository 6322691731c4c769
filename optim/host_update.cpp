#include "optim/host_update.h"

#include <chrono>
#include <cstring>

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
    g.spec = device.create_event();
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
    if (!g.direct) {
      if (g.device_masters > 0) g.p_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.device_masters)});
      g.g_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.elements)});
      if (g.host_masters > 0)
        g.c_host = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.host_masters)}, DType::Bf16);
    }
    if (!speculative_ || !g.early) continue;
    const std::size_t before = host_bytes_;
    g.m_shadow = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.elements)});
    g.v_shadow = Tensor::empty(host_, Shape{static_cast<std::int64_t>(g.elements)});
    // A direct group has no parameter staging to speculate into: every master gets a shadow.
    const std::size_t masters = g.direct ? g.elements : g.host_masters;
    if (masters > 0) g.p_shadow = Tensor::empty(host_, Shape{static_cast<std::int64_t>(masters)});
    shadow_bytes_ += host_bytes_ - before;
  }
  staged_ = true;
}

void HostUpdate::begin_step(float lr, const AdamWHyper& hyper, int step) {
  if (!staged_) allocate_staging();
  // A skipped step's early downloads were never waited for: this step's work must not write the
  // gradients they read before they are done. Its speculations are dropped: the live state is
  // intact, and the next download waits for them before it overwrites the staging they read.
  order_after_downloads(compute_);
  for (Group& g : groups_) g.downloaded = g.speculated = false;
  last_ = {};
  coef_ = 1.0f;
  lr_ = lr;
  hyper_ = hyper;
  step_ = step;
  announced_ = true;
}

// Staging is free to overwrite once the previous step's upload from it is done: compute waited
// for it (params_needed) before the work this stream waits for, and if it did not, this stream
// waits for the upload itself. A direct group copies nothing: its gradients are final (and, from
// step(), clipped) at this point of `after`, which is all its update waits for.
void HostUpdate::download(Group& g, Stream& after) {
  g.downloaded = true;
  g.reads = g.down.get();
  if (g.direct) {
    after.record(*g.down);
    return;
  }
  if (g.pending) d2h_->wait(*g.up);
  if (g.spec_events) d2h_->wait(*g.spec);  // a speculation reads the staging and writes its parameters
  const std::size_t i = static_cast<std::size_t>(&g - groups_.data());
  d2h_->trace_begin(str("download group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
  for (const Span& s : g.spans) {
    if (!s.compute) d2h_->copy(g.p_host.f32() + s.p_at, s.param, s.n * sizeof(float));
    d2h_->copy(g.g_host.f32() + s.at, s.grad, s.n * sizeof(float));
    copied_bytes_ += (s.compute ? 1 : 2) * s.n * sizeof(float);
  }
  d2h_->trace_end();
  d2h_->record(*g.down);
}

// A staged group's gradients are read by its download; a direct group's by its CPU update (or
// speculation) in place.
void HostUpdate::order_after_downloads(Stream& s) {
  for (Group& g : groups_)
    if (g.downloaded) s.wait(*g.reads);
}

void HostUpdate::grads_final(std::size_t group, Stream* after) {
  Group& g = groups_.at(group);
  if (!g.early || g.downloaded || !staged_) return;
  Stream& s = after ? *after : compute_;
  if (!g.direct) {
    s.record(*g.final);
    d2h_->wait(*g.final);
  }
  download(g, s);
  if (speculative_ && announced_) speculate(group);
}

// The update as step() would run it with coefficient 1, into the shadows (see the header): the
// live moments and masters are only read. A direct group reads its gradients and masters in place
// and writes every new master into its shadow; the commit rounds the bf16 copies (writing the live
// copies here would leave them wrong for a step that is then skipped).
void HostUpdate::speculate(std::size_t i) {
  Group& g = groups_[i];
  cpu_->wait(*g.down);
  if (!dry_) {
    cpu_->trace_begin(str("speculative update group ", i), trace::cat::kOptimizer,
                      TraceArgs().add(trace::arg::kGroup, i));
    cpu_->enqueue_host([&g, lr = lr_, hyper = hyper_, step = step_] {
      const auto start = std::chrono::steady_clock::now();
      for (const Span& s : g.spans) {
        const AdamWScalars c = adamw_scalars(lr, hyper, step, s.decay);
        if (g.direct) {
          cpu_adamw_update_copy(g.p_shadow.f32() + s.at, s.param, s.grad, g.m_shadow.f32() + s.at, s.m,
                                g.v_shadow.f32() + s.at, s.v, s.n, c);
          continue;
        }
        float* p = s.compute ? g.p_shadow.f32() + s.p_at : g.p_host.f32() + s.p_at;
        cpu_adamw_update_copy(p, s.compute ? s.param : nullptr, g.g_host.f32() + s.at, g.m_shadow.f32() + s.at, s.m,
                              g.v_shadow.f32() + s.at, s.v, s.n, c);
        if (s.compute) round_to_bf16(g.c_host.as<bf16>() + s.p_at, p, s.n);
      }
      g.spec_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    });
    cpu_->trace_end();
  }
  cpu_->record(*g.spec);
  g.speculated = g.spec_events = true;
  if (g.direct) g.reads = g.spec.get();
}

// The CPU update of group i on the cpu stream once its download is done, while later groups
// download and earlier ones upload; the host thread only enqueues (the arithmetic may still be
// running when the next step starts enqueueing). Everything the task reads is either captured by
// value or stays unchanged until its upload is done (download waits for it before overwriting the
// staging; settle waits for every upload). A direct group's update reads the clipped gradients
// in place (the clipper scaled them on the device stream) and writes its masters and bf16 copies
// in place (the next step's first use of them waits for `up`, recorded after it).
void HostUpdate::enqueue_update(std::size_t i, bool rescale, float coef, float lr, const AdamWHyper& hyper, int step) {
  Group& g = groups_[i];
  STP_ASSERT(!g.direct || !rescale, "HostUpdate: a direct group's gradients are clipped in place");
  cpu_->wait(*g.down);
  if (!dry_) {
    cpu_->trace_begin(str("update group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
    cpu_->enqueue_host([&g, rescale, coef, lr, hyper, step] {
      if (rescale) {
        float* x = g.g_host.f32();
        for (std::size_t k = 0; k < g.elements; ++k) x[k] *= coef;
      }
      for (const Span& s : g.spans) {
        float* p = s.compute || g.direct ? s.param : g.p_host.f32() + s.p_at;
        const float* grad = g.direct ? s.grad : g.g_host.f32() + s.at;
        cpu_adamw_update(p, grad, s.m, s.v, s.n, adamw_scalars(lr, hyper, step, s.decay));
        if (s.compute) round_to_bf16(g.direct ? s.compute : g.c_host.as<bf16>() + s.p_at, p, s.n);
      }
    });
    cpu_->trace_end();
  }
  cpu_->record(*g.updated);
  if (g.direct) g.reads = g.updated.get();
  else h2d_->wait(*g.updated);
}

// A committed speculation: the upload needs only the speculative update (its staging holds the
// new parameters or bf16 copies); the shadows go over the live state behind it on the cpu stream,
// before any later update reads that state.
void HostUpdate::enqueue_commit(std::size_t i) {
  Group& g = groups_[i];
  if (!g.direct) h2d_->wait(*g.spec);
  if (!dry_) {
    cpu_->trace_begin(str("commit group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
    cpu_->enqueue_host([&g, &hidden = hidden_ns_] {
      for (const Span& s : g.spans) {
        for_cpu_blocks(s.n, [&](std::size_t begin, std::size_t end) {
          const std::size_t bytes = (end - begin) * sizeof(float);
          std::memcpy(s.m + begin, g.m_shadow.f32() + s.at + begin, bytes);
          std::memcpy(s.v + begin, g.v_shadow.f32() + s.at + begin, bytes);
          if (g.direct) {  // every master from its shadow, and a host master's bf16 copy rounded from it
            const float* p = g.p_shadow.f32() + s.at;
            std::memcpy(s.param + begin, p + begin, bytes);
            if (s.compute)
              for (std::size_t k = begin; k < end; ++k) s.compute[k] = from_f32<bf16>(p[k]);
          } else if (s.compute) {
            std::memcpy(s.param + begin, g.p_shadow.f32() + s.p_at + begin, bytes);
          }
        });
      }
      hidden += g.spec_ns;
    });
    cpu_->trace_end();
  }
  cpu_->record(*g.updated);
}

void HostUpdate::step(float lr, const AdamWHyper& hyper, int step) {
  const float coef = coef_;
  if (!staged_) allocate_staging();
  // The groups not downloaded early (or whose speculation is discarded): parameters and clipped
  // gradients, after compute's work so far.
  compute_.record(*ready_);
  d2h_->wait(*ready_);
  const bool as_announced = announced_ && lr == lr_ && step == step_ && hyper.beta1 == hyper_.beta1 &&
                            hyper.beta2 == hyper_.beta2 && hyper.eps == hyper_.eps &&
                            hyper.weight_decay == hyper_.weight_decay;
  std::vector<bool> scale(groups_.size()), commit(groups_.size());
  last_ = {};
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    commit[i] = g.speculated && as_announced && coef == 1.0f;
    if (g.speculated && !commit[i]) g.downloaded = false;  // discarded: its staging holds its output
    if (g.speculated) ++(commit[i] ? last_.committed : last_.discarded);
    g.speculated = false;
    // An early copy holds the unclipped gradient; a direct group reads the clipped one, from here.
    scale[i] = g.downloaded && coef != 1.0f && !g.direct;
    if (!g.downloaded || (g.direct && !commit[i])) download(g, compute_);
  }
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    if (commit[i]) enqueue_commit(i);
    else enqueue_update(i, scale[i], coef, lr, hyper, step);
    g.pending = true;
    if (g.direct) {  // updated in place: nothing to upload
      cpu_->record(*g.up);
      continue;
    }
    h2d_->trace_begin(str("upload group ", i), trace::cat::kOptimizer, TraceArgs().add(trace::arg::kGroup, i));
    for (const Span& s : g.spans) {
      if (s.compute) h2d_->copy(s.compute, g.c_host.as<bf16>() + s.p_at, s.n * sizeof(bf16));
      else h2d_->copy(s.param, g.p_host.f32() + s.p_at, s.n * sizeof(float));
      copied_bytes_ += s.n * (s.compute ? sizeof(bf16) : sizeof(float));
    }
    h2d_->trace_end();
    h2d_->record(*g.up);
  }
  announced_ = false;
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
