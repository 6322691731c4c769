// The optimizer of one rank, behind one seam. The trainer drives every mechanism that keeps and
// updates a rank's optimizer state through this interface and never asks which one it has;
// make_rank_optimizer, the only place that chooses, picks it from the options:
//
//   ReplicatedOptimizer (optim/replicated_optimizer.h)  every replica holds the whole AdamW
//       state on the device; with dp > 1 the gradients are all-reduced over the replicas
//       (optim/dp_grad_sync.h), chunk by chunk as the backward finishes them.
//   OffloadedOptimizer (optim/offloaded_optimizer.h)  the same, with the state of the chunks the
//       plan places on the host in pinned host memory, updated by the CPU (optim/host_update.h;
//       memory.optimizer_offload).
//   DistributedOptimizer (optim/distributed_optimizer.h)  ZeRO-1: the dp replicas split the state
//       (parallel.distributed_optimizer with dp > 1); host chunks' owned state updated by the CPU.
//
// A new placement of the model states (per chunk, OptimizerPlacement) is a new implementation and
// one line of the factory; the trainer does not change.
//
// Lifecycle, on the rank's host thread:
//
//   auto opt = make_rank_optimizer(options);   // decides; allocates no device memory yet
//   spec.host_masters / shard_masters = opt->masters(c) for every local chunk c, then build stages
//   opt->attach(stages);                       // the state, in the allocator's OptimizerState category
//   executor hooks = opt->hooks();
//   per step:  opt->begin_step(lr);  executor.run_step();  opt->finish_gradients(sum_tied);
//              float* ss = opt->grad_sumsq(replica);  — the caller decides finite or not —
//              if finite: [opt->clip(max_norm);]  opt->step(lr);
//   between steps: settle(), the checkpoint views, loads.
//
// Every method only enqueues stream work unless it says otherwise; the update of a step may be in
// flight when step() returns (the next step orders on it through the params_needed hook, anything
// outside a step calls settle()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "core/kernels/optim_kernels.h"
#include "core/tensor.h"
#include "memory/plan.h"
#include "models/stage.h"

namespace stp {

class TraceRecorder;

struct RankOptimizerOptions {
  Device* device = nullptr;
  Stream* compute = nullptr;   // the rank's compute stream: every update is ordered on it
  Allocator* alloc = nullptr;  // device memory for the state (the rank's arena)
  AdamWHyper hyper;
  // Per local chunk, where its optimizer state lives (the memory plan's decision).
  std::vector<OptimizerPlacement> placement;
  // A host chunk's GEMM weights keep their f32 masters in pinned host memory
  // (MemorySettings::host_masters).
  bool host_masters = false;
  bool bf16 = false;  // train.precision bf16: the distributed optimizer shards the masters too
  // Data parallelism.
  bool distributed = false;  // parallel.distributed_optimizer
  int dp = 1, dp_rank = 0;   // the job's replicas and this rank's replica: the state's sharding
  // The DP group (the ranks with this pp and tp rank in every replica); null where this process
  // builds one replica (dp 1, or a dry run of a larger job: state allocated, nothing sent).
  Communicator* dp_comm = nullptr;
  std::size_t bucket_bytes = 0;  // parallel.dp_bucket (0: one bucket per chunk)
  // The dp collectives over a streamed chunk's buffers (pinned host memory) go through a device
  // staging piece, one bucket at a time (optim/staged_comm.h): the communicator cannot read host
  // memory (stages_host_collectives, config/config.h). Also in a dry run of a larger job, which
  // sends nothing but allocates the pieces alike.
  bool stage_host_collectives = false;
  // The CPU update of a host chunk whose gradients are final early speculates on the clip
  // coefficient and the guard (memory.optimizer_overlap; optim/host_update.h, Speculation).
  bool speculate = false;
  int tp_rank = 0;  // TP-replicated gradients enter the norm on TP rank 0 only
  // The CPU update's streams run on these CPUs (the emulated copy engine's), else near this NUMA
  // node (-1: unbound).
  std::vector<int> copy_cpus;
  int host_node = -1;
  TraceRecorder* trace = nullptr;  // the optimizer's streams record into it (null: no trace)
  int trace_rank = 0;
  bool dry_run = false;  // a dry device: copies are enqueued, no CPU arithmetic runs
};

// Where a chunk's stage keeps the f32 masters of its GEMM weights (StageSpec fields).
struct StageMasters {
  Allocator* host = nullptr;  // StageSpec::host_masters: in this pinned host memory
  bool sharded = false;       // StageSpec::shard_masters: owned parts only, across the dp ranks
};

// The executor's calls into the optimizer (RankResources::grads_final / params_needed); an empty
// function is a point the mechanism does not need.
struct OptimizerHooks {
  std::function<void(int chunk)> grads_final;
  std::function<void(int chunk)> params_needed;
};

class RankOptimizer {
 public:
  virtual ~RankOptimizer() = default;

  // ---- building
  virtual StageMasters masters(int chunk) const = 0;
  // The rank's stages, [local chunk]; they outlive the optimizer. Allocates the state.
  virtual void attach(const std::vector<Stage*>& stages) = 0;
  virtual OptimizerHooks hooks() = 0;
  // Every stage's parameters (views), in chunk order: the order of every per-parameter list below.
  virtual const std::vector<ParamInfo>& params() const = 0;

  // ---- a step
  // Zeroes every gradient of the rank and forgets the last step's per-step state. lr: the learning
  // rate step() will be given if the step is not skipped (a CPU update may start on it early:
  // memory.optimizer_overlap, optim/host_update.h, Speculation).
  virtual void begin_step(float lr) = 0;
  // After the executor's step: the gradients are final and reduced over the dp replicas (as far as
  // the mechanism reduces them) once compute reaches this point. sum_tied: the caller's sum of the
  // tied parameter's gradients, run where the reduction needs it (it is linear: before a
  // reduce-scatter or after an all-reduce gives the same sums).
  virtual void finish_gradients(const std::function<void()>& sum_tied) = 0;
  // Orders `s` after every read of the gradients still in flight (early downloads), before the
  // caller writes them in place.
  virtual void order_gradient_writes(Stream& s) = 0;
  // A gradient element this rank's norm counts and this rank updates (the non-finite guard's test
  // hook poisons it).
  virtual float* owned_gradient() = 0;
  // The global sum of squares of the gradients (each distinct gradient once): this rank's share,
  // summed over `replica` (every rank of one replica) and over the dp ranks where they hold
  // disjoint parts. Returns a device scalar valid at compute's current point.
  virtual float* grad_sumsq(Communicator& replica) = 0;
  // Global-norm clipping with the sum grad_sumsq left (torch.nn.utils.clip_grad_norm_).
  virtual void clip(float max_norm) = 0;
  virtual const float* clip_coef() const = 0;  // device scalar, valid after clip()'s work
  // One AdamW step of every parameter the rank updates; the update may still be in flight.
  virtual void step(float lr) = 0;

  // ---- between steps
  // The optimizer's own streams to drain (Rank::synchronize); except_in_flight: all but those
  // carrying the last update's uploads and all-gathers, which the next step orders on chunk by
  // chunk (params_needed).
  virtual std::vector<Stream*> streams(bool except_in_flight) = 0;
  // Host wait for every update, upload and all-gather in flight: before anything outside a step
  // reads or writes the parameters or the state.
  virtual void settle() = 0;
  // Checkpoints (collectives over the dp ranks where the state is sharded; after settle()): the
  // f32 parameters and the moments (0: exp_avg, 1: exp_avg_sq) as if unsharded, as full per-rank
  // shards in params() order. Views valid until the next such call or step.
  virtual std::vector<Tensor> full_parameters() = 0;
  virtual std::vector<Tensor> full_moments(int which) = 0;
  // Loads one moment (0: exp_avg, 1: exp_avg_sq) of parameter params()[param] from its full
  // per-rank shard (host, p.grad.numel() values; waits for the copies). A load of a whole state
  // is this for every parameter and both moments, in any order.
  virtual void load_moment(int which, std::size_t param, const std::vector<float>& shard) = 0;
  // The parameters were initialised or loaded (after the stages' init or loads on compute).
  virtual void parameters_loaded() = 0;
  virtual std::int64_t step_count() const = 0;  // steps taken (0 before the first)
  virtual void set_step_count(std::int64_t steps) = 0;

  // ---- memory outside the device budget
  virtual std::size_t host_state_bytes() const = 0;   // pinned host: moments, masters, staging
  virtual std::size_t host_master_bytes() const = 0;  // of the optimizer's memory: f32 masters
  virtual std::size_t host_shadow_bytes() const = 0;  // of it: the speculation's shadows (options.speculate)

  // ---- the CPU update's speculation (options.speculate; optim/host_update.h, Speculation)
  struct Speculation {
    std::size_t committed = 0, discarded = 0;  // the last step()'s chunks
    double hidden_s = 0;  // CPU time of committed speculative updates so far (counted as each commit runs)
  };
  virtual Speculation speculation() const { return {}; }
};

// Chooses the mechanism (see the header comment).
std::unique_ptr<RankOptimizer> make_rank_optimizer(const RankOptimizerOptions& options);

}  // namespace stp
