#include "optim/replicated_optimizer.h"

#include <algorithm>

#include "base/error.h"

namespace stp {

ReplicatedOptimizer::ReplicatedOptimizer(RankOptimizerOptions options)
    : o_(std::move(options)), dp_stream_(make_dp_stream(o_)) {}

void ReplicatedOptimizer::attach(const std::vector<Stage*>& stages) {
  params_ = RankParams::of(stages, o_.tp_rank);
  HostUpdate* host = host_update();
  adamw_ = std::make_unique<AdamW>(params_.list, o_.hyper, *o_.alloc, *o_.compute, host, params_.chunk,
                                   host ? RankParams::host_chunks(o_) : std::vector<bool>{});
  clipper_ = std::make_unique<GradClipper>(params_.list, *o_.alloc, params_.counted());
  // The fused AdamW reads the device parameters' gradients times the coefficient; clip() scales
  // only the gradients the CPU update downloads.
  std::vector<bool> scaled = adamw_->device_updated();
  scaled.flip();
  clipper_->set_scaled(std::move(scaled));
  if (dp_stream_) {
    std::vector<bool> staged = staged_chunks(o_, stages);
    std::unique_ptr<StagedComm> staging;
    if (std::find(staged.begin(), staged.end(), true) != staged.end())
      staging = std::make_unique<StagedComm>(o_.dp_comm, *o_.alloc, o_.dp_rank, o_.dp);
    dp_sync_ =
        std::make_unique<DpGradSync>(params_.flat_grads(), o_.dp_comm, *o_.device, *o_.compute, *dp_stream_,
                                     o_.bucket_bytes, o_.trace != nullptr, std::move(staged), std::move(staging));
  }
}

OptimizerHooks ReplicatedOptimizer::hooks() {
  OptimizerHooks h;
  if (dp_sync_) h.grads_final = [sync = dp_sync_.get()](int chunk) { sync->chunk_final(chunk); };
  return h;
}

void ReplicatedOptimizer::begin_step(float) {
  // The last step's fused update wrote the bf16 GEMM copies; otherwise zero_grads refreshes them.
  for (Stage* s : params_.stages) {
    if (copies_current_) s->zero_grads_keep_copies(*o_.compute);
    else s->zero_grads(*o_.compute);
  }
  if (dp_sync_) dp_sync_->begin_step();
  clipped_ = false;
}

void ReplicatedOptimizer::finish_gradients(const std::function<void()>& sum_tied) {
  if (dp_sync_) dp_sync_->finish();
  sum_tied();
}

float* ReplicatedOptimizer::owned_gradient() {
  for (std::size_t i = 0; i < params_.list.size(); ++i)
    if (params_.own(i)) return params_.list[i].grad.f32();
  STP_UNREACHABLE("this rank holds no gradient of its own");
}

float* ReplicatedOptimizer::grad_sumsq(Communicator& replica) {
  clipper_->local_sumsq(*o_.compute);
  replica.all_reduce_sum(*o_.compute, clipper_->sumsq(), 1);
  return clipper_->sumsq();
}

void ReplicatedOptimizer::clip(float max_norm) {
  clipper_->clip(*o_.compute, max_norm);
  clipped_ = true;
}

void ReplicatedOptimizer::step(float lr) {
  adamw_->step(*o_.compute, lr, clipped_ ? clipper_->coef() : nullptr);
  clipped_ = false;
  copies_current_ = true;
}

std::size_t ReplicatedOptimizer::update_launches() const {
  return clipper_->sumsq_launches() + 1 + adamw_->device_launches();
}

std::vector<Stream*> ReplicatedOptimizer::streams(bool) {
  if (!dp_stream_) return {};
  return {dp_stream_.get()};  // the reductions are done when a step ends
}

std::vector<Tensor> ReplicatedOptimizer::full_parameters() {
  std::vector<Tensor> out;
  for (const ParamInfo& p : params_.list) out.push_back(p.param);
  return out;
}

std::vector<Tensor> ReplicatedOptimizer::full_moments(int which) {
  STP_ASSERT(which == 0 || which == 1, "moment ", which);
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < params_.list.size(); ++i)
    out.push_back(which == 0 ? adamw_->exp_avg(i) : adamw_->exp_avg_sq(i));
  return out;
}

void ReplicatedOptimizer::load_moment(int which, std::size_t param, const std::vector<float>& shard) {
  STP_ASSERT(which == 0 || which == 1, "moment ", which);
  STP_ASSERT(param < params_.list.size(), "load_moment: parameter ", param, " of ", params_.list.size());
  const Tensor& dst = which == 0 ? adamw_->exp_avg(param) : adamw_->exp_avg_sq(param);
  STP_ASSERT(static_cast<std::int64_t>(shard.size()) == dst.numel(), "load_moment: ", shard.size(), " values for ",
             dst.numel());
  upload(dst, shard.data(), *o_.compute);
}

}  // namespace stp
