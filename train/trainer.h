// Trainer: one process's part of a training run. Builds the ranks this process drives (one device,
// one host thread and one executor each) — all dp × pp × tp of them, or under a multi-process
// launch exactly one (train/rank_layout.h: global rank = (dp_rank * pp + pp_rank) * tp + tp_rank,
// TP innermost) — the communicators between all ranks, each rank's stages, optimizer and
// gradient clipper, and runs optimizer steps. Multi-process jobs: docs/scale-out.md.
//
// Usage (tools/stp/cmd_train.cpp, tests):
//   Trainer t(cfg);                     // validates the config against schedule and model, builds ranks
//   StepResult r = t.step();            // one optimizer step over train.microbatches microbatches
//   auto full = t.full_parameters();    // HF-named full tensors gathered from every shard
//   t.save_checkpoint(); / Trainer t2(cfg) with train.resume = path
//
// One step on each rank: zero grads; upload this step's tokens/targets (its replica's share of the
// global batch); walk the op list (train/executor.h), all-reducing gradients over the data-parallel
// replicas as chunks finish (optim/dp_grad_sync.h); sum tied embedding grads; gather the losses;
// global-norm clip over the replica; AdamW (identical on every replica).
// Ranks run on their own threads; an error on one rank aborts every communicator so no rank
// hangs, and the first error is rethrown by step().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "base/trace.h"
#include "core/gemm_shape.h"
#include "memory/plan.h"
#include "offload/param_streamer.h"
#include "formats/safetensors.h"

namespace stp {

class ProcessGroup;

struct StepResult {
  std::int64_t step = 0;  // 1-based step just completed
  // The mean token cross-entropy over the counted targets of the global batch (every replica's
  // microbatches): all of them, or those data.mask_path leaves in (docs/config.md, Loss masks).
  double loss = 0;
  std::uint64_t counted_targets = 0;  // how many targets of the global batch counted in loss
  double lr = 0;
  double step_ms = 0;
  double tokens_per_s = 0;  // of the global batch
  // Health. A step whose loss or global gradient norm is not finite is skipped: no optimizer
  // update (parameters, moments and AdamW's step count stay as they were); its step number, lr
  // and batch are used up all the same. Decided from values every rank holds after a reduction
  // over all ranks, so every rank decides alike.
  bool skipped = false;
  std::int64_t skipped_steps = 0;      // skipped so far in this process's run
  std::int64_t consecutive_skips = 0;  // skipped in a row up to this one (0 after an update)
  double grad_norm = 0;                // global gradient norm before clipping
  double clip_coef = 1;                // what the gradients were multiplied by (1: no clipping)
  std::int64_t tokens_seen = 0;        // global-batch tokens of every step so far (skipped ones too)
  // Per device of this process (global rank order), since start: bytes in live blocks of the caching allocator
  // (what the planner predicts exactly), and bytes it reserved from the device (<= the budget).
  std::vector<std::uint64_t> peak_device_bytes;
  std::vector<std::uint64_t> peak_device_reserved_bytes;
  std::uint64_t peak_host_pinned_bytes = 0;
  // Kernel launches this step enqueued, per device of this process (global rank order):
  // Device::launch_count's difference over the step (index launches, launch shapes, GEMMs, zero
  // fills). The same on every backend for the same config.
  std::vector<std::uint64_t> launches;
  // GEMM algorithms this step chose itself because setup had not prepared their shape, per device
  // of this process (global rank order): Device::late_gemm_choices' difference over the step. 0
  // when Trainer::prepared_gemms holds every shape the step runs; the same on every backend.
  std::vector<std::uint64_t> late_gemm_choices;
  // This step's activation offload per device (global rank order; empty when nothing offloads).
  struct Offload {
    std::uint64_t d2h_bytes = 0, h2d_bytes = 0;
    double d2h_busy_s = 0, h2d_busy_s = 0;  // copy-stream time spent copying (bytes / busy = rate)
    double stall_s = 0;                     // compute waited for reloads
  };
  std::vector<Offload> offload;
  // memory.optimizer_overlap (docs/memory.md, Optimizer overlap), over the devices of this process:
  // the host chunks whose speculative CPU update this step committed or discarded, and the CPU
  // update time the committed ones took off the step's tail (counted as their commits run: a
  // commit still queued when the step returns counts in the next step).
  struct Speculation {
    std::uint64_t committed = 0, discarded = 0;
    double hidden_s = 0;
  };
  Speculation speculation;
  // This step's parameter streaming per device (memory.param_offload; global rank order; empty
  // when nothing streams): weights and gradients up, gradients down.
  std::vector<ParamStreamCounters> param_stream;
};

// What Trainer::try_save_checkpoint did. A state is written only when it is good: every parameter
// and both AdamW moments finite, every exp_avg_sq >= 0, checked on the tensors as gathered for the
// files (docs/config.md, Non-finite steps and health metrics). Every process of the job agrees.
struct CheckpointSave {
  bool written = false;  // false: the state was not good and nothing was written
  std::string path;      // the folder written (process 0; "" on the other processes)
  // When not written (process 0): which step's state, which file and tensor hold what, and where
  // the last good state is, e.g. "the state after step 2 is not finite: model.safetensors: tensor
  // 'wte.weight' holds 5 values that are not finite (the first, at index 3, is inf); it was not
  // written. The last good state is checkpoint runs/x/checkpoint-1 (after step 1)".
  std::string problem;
  // The most bytes of pageable host memory the save held at once for the tensors (process 0: one
  // full f32 tensor with one shard, then with one Hugging Face part of it): what
  // train/host_needs.h predicts as HostPageable::checkpoint_save.
  std::size_t pageable_peak_bytes = 0;
};

struct TrainerOptions {
  // Dry run (core/cpu/dry_stream.h): devices that count allocations and run nothing, no data
  // read, no initialisation — how the planner predicts a real run's memory exactly. The checks
  // that need no data still run (the schedule's placement, memory.copy_engine_cpus against this
  // machine's CPUs), so that `stp plan` refuses what `stp train` would.
  bool dry_run = false;
  // Use this plan instead of planning (dry runs of the planner; tests).
  const MemoryPlan* plan = nullptr;
  // The job's processes (process/process.h) when launched by MPI; null or one process: this process
  // drives every rank. With several processes, dp × pp × tp must equal their number.
  ProcessGroup* processes = nullptr;
  // Keep every device arena's allocation trace (DeviceMemory::allocations): what the planner lays a
  // planned placement out from (memory/placement_table.h).
  bool record_allocations = false;
};

// Bytes one rank sent by kind (Communicator::bytes_sent: an all-reduce counts its buffer once):
// tp = TP all-reduces; pp = pipeline activations and gradients; dp = data-parallel gradient
// all-reduces; other = tied-embedding gradient sum, global grad norm, step losses.
struct CommBytes {
  int global = 0;
  std::uint64_t tp = 0, pp = 0, dp = 0, other = 0;
};

class Trainer {
 public:
  // Plans memory (memory/planner.h) unless options.plan is given; throws stp::Error before any
  // step when no plan fits memory.device_budget or the pinned pools exceed memory.host_budget.
  explicit Trainer(const Config& config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepResult step();
  std::int64_t steps_done() const;
  // The last step that updated the parameters (steps_done() minus the trailing skipped steps).
  std::int64_t last_update_step() const;

  // Validation loss: the mean token cross-entropy over the counted targets (data.val_mask_path)
  // of the held-out set (the first train.eval_batches global batches of data.val_path, read in
  // order), forward only through the pipeline with no activation records kept
  // (Executor::run_forward). The same sequences every
  // time and under every layout with the same global batch; replicas split each batch as in a
  // step; losses are reduced over all ranks. An stp::Error without data.val_path (a dry run
  // evaluates without data).
  double evaluate();

  // Full tensors with HF GPT-2 names, gathered from the shards of data-parallel replica `replica`
  // (all replicas hold the same values; tests check it). Multi-process: collective (every process
  // calls it), replica 0 only; process 0 gets the tensors, the others an empty map. Between steps
  // only: the distributed optimizer's sharded bf16 masters are gathered through the gradient
  // buffers (dead between steps).
  std::map<std::string, HostTensor> full_parameters(int replica = 0);
  // The same for an AdamW moment (0: exp_avg, 1: exp_avg_sq), in stp's names; collective likewise.
  std::map<std::string, HostTensor> full_moments(int which, int replica = 0);
  // Writes output.dir/checkpoint-STEP (model, optimizer, state) if the state is good (CheckpointSave);
  // returns what it did. Multi-process: collective, written once by process 0.
  // A checkpoint does not depend on dp: it loads with any dp × pp × tp.
  // `note`: written into state.json (e.g. why the run stopped and what state this is).
  CheckpointSave try_save_checkpoint(const std::string& note = {});
  // The same, returning the path (process 0; "" on the others); a state that is not good is an
  // stp::Error with CheckpointSave::problem's text.
  std::string save_checkpoint(const std::string& note = {});
  // The most bytes of pageable host memory that loading model.init_from or train.resume held at
  // once for the tensors (one full f32 tensor with one Hugging Face tensor or one shard of it; 0
  // when neither was loaded): what train/host_needs.h predicts as HostPageable::init_from and
  // HostPageable::resume.
  std::size_t load_pageable_peak_bytes() const;
  // The tokenizer every checkpoint carries (data/tokenizer_files.h): data.tokenizer, else
  // model.init_from when it is a folder holding a tokenizer, else train.resume's checkpoint when it
  // carries one; "" when there is none (always with data.format text, and in a dry run).
  const std::string& tokenizer_source() const;
  // Trace of everything recorded so far (output.trace: true), or nullptr.
  const TraceRecorder* trace() const;
  int world_size() const;  // ranks of the job (dp × pp × tp)
  // Settings that were accepted but do nothing here or less than asked, one line each (the
  // distributed optimizer with dp = 1; a data.val_path shorter than train.eval_batches global
  // batches, read again from its start); the command line prints them as warnings.
  const std::vector<std::string>& warnings() const;
  // Bytes sent so far by each rank this process drives (global order).
  std::vector<CommBytes> comm_bytes() const;
  const MemoryPlan& memory_plan() const;
  // The GEMM shapes (core/gemm_shape.h) chosen before step 1 on the compute stream of each device
  // of this process (global rank order; Stream::prepare_gemm), distinct and ordered: those of one
  // step of this job on dry-run devices (and of an evaluation, with data.val_path), whose
  // allocations, and so the operands' offsets and alignments, are the real run's. Empty in a dry run.
  std::vector<std::vector<GemmShape>> prepared_gemms() const;
  // From now on, the compute stream of device i of this process (global rank order) adds the shape
  // of every GEMM it enqueues to logs[i] (Stream::set_gemm_log; null: stop). The logs must outlive
  // the recording; one entry per device.
  void set_gemm_logs(const std::vector<GemmLog*>& logs);
  // Per device (global rank): the caching allocator's statistics, offload counters and the
  // pinned pool's statistics (zero when the rank does not offload).
  struct DeviceMemory {
    ArenaStats device;
    ArenaStats pinned;
    std::uint64_t d2h_bytes = 0, h2d_bytes = 0, late_prefetches = 0;
    // Device memory the communicators took outside memory.device_budget (NCCL's buffers, connected
    // while the trainer was built): the device's free memory before minus after creating them.
    // 0 where the device reports no physical memory (the CPU backend).
    std::uint64_t communicator_bytes = 0;
    std::size_t optimizer_host_bytes = 0;    // memory.optimizer_offload: moments + staging, pinned host
    std::size_t host_master_bytes = 0;       // of those: f32 masters (bf16; host or owned sharded masters)
    std::size_t optimizer_shadow_bytes = 0;  // of those: the speculation's shadows (memory.optimizer_overlap)
    // memory.param_offload: the streamed chunks' weights (with bf16 copies) and gradients, pinned host
    std::size_t streamed_weight_bytes = 0, streamed_grad_bytes = 0;
    AllocationTrace allocations;  // the device arena's (TrainerOptions::record_allocations)
  };
  std::vector<DeviceMemory> device_memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stp
