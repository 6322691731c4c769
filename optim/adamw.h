// AdamW over one rank's parameter shards (ParamInfo, models/stage.h), and with GradClipper
// (optim/grad_clipper.h) global-norm gradient clipping across ranks. All math is stream work (optim_kernels.h);
// nothing here synchronizes or reads device memory on the host.
//
// One training step on every rank, with `comm` spanning every rank that holds distinct grads
// (TP x PP x DP; tied/replicated copies are counted once, see GradClipper):
//
//   clipper.local_sumsq(s);                          // sumsq = sum over counted grads of g^2
//   comm.all_reduce_sum(s, clipper.sumsq(), 1);      // the global sum, identical on every rank
//   clipper.clip(s, cfg.train.grad_clip);            // coef = min(1, max_norm / (norm + 1e-6))
//   adamw.step(s, float(schedule.at(step)), clipper.coef());   // AdamW of every shard on g * coef
//
// With grad_clip 0 skip the clipper (or call local_sumsq + all_reduce only to log the norm) and
// pass no coefficient.
//
// The fused pass: the device parameters are updated as flat runs — consecutive parameters of one
// group (list order) whose params and grads lie back to back (a chunk's flat buffers, ParamStore)
// — with one flat exp_avg and exp_avg_sq each, in adamw_flat_step's few launches per run (one for
// every model stp ships), which read each gradient times the clip coefficient: clip() need not
// scale those gradients in place (GradClipper::set_scaled with device_updated()). Bitwise the
// per-tensor scale_by_scalar + adamw_step, and the CPU AdamW of an offloaded group. The same
// launch writes the bf16 GEMM copy (ParamInfo::compute, bf16 precision) of every device
// parameter that has one — the bits the stage's refresh_compute would write — so after a step
// the device parameters' copies are current and the next step need not refresh them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/kernels/optim_kernels.h"
#include "core/tensor.h"
#include "models/stage.h"
#include "optim/host_update.h"

namespace stp {

struct OptimConfig;

AdamWHyper adamw_hyper(const OptimConfig& optim);

class AdamW {
 public:
  // exp_avg / exp_avg_sq (same shapes as the params) are allocated from `alloc` and zeroed on s.
  // `params` must outlive the optimizer; its tensors may not be replaced.
  // host (optimizer offload): the moments of the parameters whose group is on the host live in
  // host->allocator()'s pinned host memory instead and step() runs their update there
  // (optim/host_update.h), parameter i in group param_group[i]; host_groups[g] says whether group g
  // is on the host (empty: every group). The other parameters keep device moments and the device
  // update: a rank may hold some chunks' state on the host and others' on the device.
  // host must outlive the optimizer.
  AdamW(std::vector<ParamInfo>& params, const AdamWHyper& hyper, Allocator& alloc, Stream& s,
        HostUpdate* host = nullptr, const std::vector<int>& param_group = {},
        const std::vector<bool>& host_groups = {});

  // Counts one step, then updates every parameter: decay iff ParamInfo::decay (>= 2 dims).
  // The device parameters' updates are enqueued on s first, then the host groups' update runs
  // (the CPU update of early-downloaded groups overlaps the device updates); offloaded: the uploads
  // of the updated parameters are left in flight, and the caller orders its next use of each
  // group's parameters on them (HostUpdate::params_needed, settle).
  // coef: null, or the device scalar the device parameters' gradients are multiplied by as they
  // are read (GradClipper::coef; the host groups' gradients the clipper scaled in place).
  void step(Stream& s, float lr, const float* coef = nullptr);
  bool offloaded() const { return host_ != nullptr; }
  // [param]: whether step() updates it on the device (its gradient is read times coef).
  std::vector<bool> device_updated() const;
  // Stream operations of one step's device update (launches; the test of the fused pass).
  std::size_t device_launches() const;

  std::int64_t step_count() const { return step_count_; }           // steps taken (0 before the first)
  void set_step_count(std::int64_t steps) { step_count_ = steps; }  // when resuming

  std::size_t size() const { return exp_avg_.size(); }
  const Tensor& exp_avg(std::size_t i) const { return exp_avg_[i]; }  // same order as params
  const Tensor& exp_avg_sq(std::size_t i) const { return exp_avg_sq_[i]; }
  const AdamWHyper& hyper() const { return hyper_; }

 private:
  std::vector<ParamInfo>& params_;
  AdamWHyper hyper_;
  struct Run {  // a flat run: params [first, end), its moments flat
    std::size_t first, end;
    std::vector<FlatSegment> segments;
    Tensor m, v;
    bf16* copies;        // the bf16 copies of its copy segments, back to back (null: none)
    std::size_t copied;  // their elements
  };
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<Run> runs_;
  HostUpdate* host_ = nullptr;
  std::vector<bool> on_host_;  // [param]
  std::int64_t step_count_ = 0;
};

}  // namespace stp
