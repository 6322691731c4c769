#include "optim/offloaded_optimizer.h"

#include <algorithm>

#include "base/error.h"

namespace stp {

OffloadedOptimizer::OffloadedOptimizer(RankOptimizerOptions options)
    : ReplicatedOptimizer(std::move(options)), host_(make_host_update(o_)) {
  STP_ASSERT(host_ != nullptr, "OffloadedOptimizer: no chunk is placed on the host");
}

StageMasters OffloadedOptimizer::masters(int chunk) const {
  StageMasters m;
  if (o_.host_masters && RankParams::host_chunks(o_).at(static_cast<std::size_t>(chunk))) m.host = &host_->allocator();
  return m;
}

void OffloadedOptimizer::attach(const std::vector<Stage*>& stages) {
  ReplicatedOptimizer::attach(stages);
  // A chunk without the tied parameter (whose gradient the tied sum still changes) is final at its
  // last backward with one replica, and once its all-reduce has landed with several: downloaded
  // then only to speculate (the download after the step's reductions costs nothing more without).
  // Decided without asking for dp_sync_ where it would differ from a dry run of one replica only in
  // downloads, never in the shadows (HostUpdate allocates them for speculating early groups).
  const std::vector<bool> on_host = RankParams::host_chunks(o_);
  set_direct_groups(*host_, stages);
  for (std::size_t c = 0; c < stages.size(); ++c) {
    const auto& ps = stages[c]->params();
    const bool tied = std::any_of(ps.begin(), ps.end(), [](const ParamInfo& p) { return p.tied; });
    host_->set_early(c, on_host[c] && !tied && (!dp_sync_ || o_.speculate));
  }
}

OptimizerHooks OffloadedOptimizer::hooks() {
  OptimizerHooks h = ReplicatedOptimizer::hooks();
  if (!dp_sync_)
    h.grads_final = [host = host_.get()](int chunk) { host->grads_final(static_cast<std::size_t>(chunk)); };
  else  // the chunk's all-reduce first; an early chunk downloads once it has landed
    h.grads_final = [host = host_.get(), sync = dp_sync_.get(), dp = dp_stream_.get()](int chunk) {
      sync->chunk_final(chunk);
      host->grads_final(static_cast<std::size_t>(chunk), dp);
    };
  h.params_needed = [this](int chunk) { params_needed(chunk); };
  return h;
}

void OffloadedOptimizer::begin_step(float lr) {
  host_->begin_step(lr, o_.hyper, static_cast<int>(adamw_->step_count() + 1));
  // The bf16 GEMM copies are refreshed chunk by chunk once the step waits for their uploads
  // (params_needed).
  for (Stage* s : params_.stages) s->zero_grads_keep_copies(*o_.compute);
  if (dp_sync_) dp_sync_->begin_step();
}

// A host master's bf16 copy came with the chunk's upload (optim/host_update.h); without one (the
// first step, a skipped step, after a load or settle) it is rounded from the host master here.
void OffloadedOptimizer::params_needed(int chunk) {
  const auto c = static_cast<std::size_t>(chunk);
  const bool uploaded = host_->pending(c);
  host_->params_needed(c);
  // A device chunk's copies came with its fused update (ReplicatedOptimizer::copies_current_).
  if (copies_current_ && !RankParams::host_chunks(o_).at(c)) return;
  params_.stages.at(c)->refresh_compute(*o_.compute, !uploaded);
}

void OffloadedOptimizer::clip(float max_norm) {
  clip_gradients(*clipper_, *o_.compute, host_.get(), max_norm);
  clipped_ = true;
}

std::vector<Stream*> OffloadedOptimizer::streams(bool except_in_flight) {
  std::vector<Stream*> out = ReplicatedOptimizer::streams(except_in_flight);
  add_host_streams(*host_, except_in_flight, out);
  return out;
}

// Offloaded moments live in pinned host memory, which a communicator may not send (NCCL reads
// device memory only): they go through the parameters' gradients, dead between steps.
std::vector<Tensor> OffloadedOptimizer::full_moments(int which) {
  std::vector<Tensor> out = ReplicatedOptimizer::full_moments(which);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const Tensor& grad = params_.list[i].grad;
    o_.compute->copy(grad.raw(), out[i].raw(), out[i].bytes());
    out[i] = grad;
  }
  return out;
}

RankOptimizer::Speculation OffloadedOptimizer::speculation() const { return speculation_of(host_.get()); }

std::size_t OffloadedOptimizer::host_master_bytes() const {
  std::size_t n = 0;
  for (const ParamInfo& p : params_.list)
    if (p.host_master) n += p.param.bytes();
  return n;
}

}  // namespace stp
