// The replicated optimizer with optimizer offload (memory.optimizer_offload; optim/rank_optimizer.h):
// the AdamW state of the chunks the plan places on the host lives in pinned host memory and is
// updated by the CPU (optim/host_update.h); the other chunks keep the device state and update.
//
// What it adds to ReplicatedOptimizer:
//   * masters(c): a host chunk keeps its GEMM weights' f32 masters in the host memory too, when
//     the options allow it (RankOptimizerOptions::host_masters).
//   * Early downloads: with one replica, a host chunk without the tied parameter (whose gradient
//     the tied sum still changes) downloads its parameters and gradients as soon as the executor
//     reports them final, while the backward of the other chunks goes on; with several replicas,
//     only when it speculates (memory.optimizer_overlap), once its all-reduce has landed.
//   * The update is left in flight: the next step's first use of a chunk waits for that chunk's
//     upload (the params_needed hook, a stream wait), then refreshes its bf16 GEMM copies unless
//     the upload brought them.
//   * Clipping scales the early copies on the host by the coefficient it read back; with
//     speculation (RankOptimizerOptions::speculate) an early chunk's update runs at its download.
#pragma once

#include <memory>

#include "optim/host_update.h"
#include "optim/replicated_optimizer.h"

namespace stp {

class OffloadedOptimizer final : public ReplicatedOptimizer {
 public:
  explicit OffloadedOptimizer(RankOptimizerOptions options);

  StageMasters masters(int chunk) const override;
  void attach(const std::vector<Stage*>& stages) override;
  OptimizerHooks hooks() override;

  void begin_step(float lr) override;
  void order_gradient_writes(Stream& s) override { host_->order_after_downloads(s); }
  void clip(float max_norm) override;

  std::vector<Stream*> streams(bool except_in_flight) override;
  void settle() override { host_->settle(); }
  std::vector<Tensor> full_moments(int which) override;
  std::size_t host_state_bytes() const override { return host_->host_bytes(); }
  std::size_t host_master_bytes() const override;
  Speculation speculation() const override;
  std::size_t host_shadow_bytes() const override { return host_->shadow_bytes(); }

 private:
  HostUpdate* host_update() override { return host_.get(); }
  void params_needed(int chunk);

  // Destroyed before the base's moments: its destructor waits for the CPU updates that use them.
  std::unique_ptr<HostUpdate> host_;
};

}  // namespace stp
