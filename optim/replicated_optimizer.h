// The replicated optimizer (optim/rank_optimizer.h): every data-parallel replica keeps the whole
// AdamW state of its rank's parameters on the device and takes the same step. With a dp
// communicator the gradients are first all-reduced over the replicas (optim/dp_grad_sync.h),
// each chunk as soon as the executor reports it final.
//
// OffloadedOptimizer (optim/offloaded_optimizer.h) extends it with state in pinned host memory:
// the virtual host_update() is its hook into attach().
#pragma once

#include <memory>
#include <vector>

#include "optim/dp_grad_sync.h"
#include "optim/adamw.h"
#include "optim/grad_clipper.h"
#include "optim/rank_optimizer.h"
#include "optim/rank_optimizer_parts.h"

namespace stp {

class ReplicatedOptimizer : public RankOptimizer {
 public:
  explicit ReplicatedOptimizer(RankOptimizerOptions options);

  StageMasters masters(int) const override { return {}; }
  void attach(const std::vector<Stage*>& stages) override;
  OptimizerHooks hooks() override;
  const std::vector<ParamInfo>& params() const override { return params_.list; }

  void begin_step(float lr) override;
  void finish_gradients(const std::function<void()>& sum_tied) override;
  void order_gradient_writes(Stream&) override {}
  float* owned_gradient() override;
  float* grad_sumsq(Communicator& replica) override;
  void clip(float max_norm) override;
  const float* clip_coef() const override { return clipper_->coef(); }
  void step(float lr) override;

  std::vector<Stream*> streams(bool except_in_flight) override;
  void settle() override {}
  std::vector<Tensor> full_parameters() override;
  std::vector<Tensor> full_moments(int which) override;
  void load_moment(int which, std::size_t param, const std::vector<float>& shard) override;
  void parameters_loaded() override { copies_current_ = false; }
  std::int64_t step_count() const override { return adamw_->step_count(); }
  void set_step_count(std::int64_t steps) override { adamw_->set_step_count(steps); }
  std::size_t host_state_bytes() const override { return 0; }
  std::size_t host_master_bytes() const override { return 0; }
  std::size_t host_shadow_bytes() const override { return 0; }

  // Launches of one clipped update on the compute stream beyond the dp reductions: the sum of
  // squares (GradClipper::sumsq_launches), the coefficient, and the fused AdamW — a few per chunk
  // whatever its parameter count (plus the in-place scalings of offloaded gradients).
  std::size_t update_launches() const;

 protected:
  virtual HostUpdate* host_update() { return nullptr; }

  RankOptimizerOptions o_;
  RankParams params_;
  std::unique_ptr<Stream> dp_stream_;
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<GradClipper> clipper_;
  std::unique_ptr<DpGradSync> dp_sync_;  // with a dp communicator, or staging (dp_stream_)
  // The device chunks' bf16 GEMM copies are their masters' rounding (written by the last update;
  // false before the first and after a load): the next step need not refresh them.
  bool copies_current_ = false;
  bool clipped_ = false;  // this step's clip() ran: step() reads the coefficient
};

}  // namespace stp
