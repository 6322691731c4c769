// One rank of a training process: its device, streams, stages, optimizer and communicators.
// Internal to train/ (Trainer owns the ranks; tests reach them through Trainer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "core/gemm_shape.h"
#include "core/tensor.h"
#include "memory/block_arena.h"
#include "memory/pinned_pool.h"
#include "offload/offload_engine.h"
#include "offload/param_streamer.h"
#include "models/stage.h"
#include "optim/rank_optimizer.h"
#include "train/executor.h"

namespace stp {

struct Rank {
  Rank() = default;
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  // Drains every stream before any member (stages, optimizer, buffers) is destroyed: queued work
  // may still use them, e.g. when construction fails half way or a step threw.
  ~Rank();

  int global = 0, dp_rank = 0, pp_rank = 0, tp_rank = 0;  // train/rank_layout.h
  Device* device = nullptr;
  // The NUMA node this rank's host threads are bound to before they drive the device: a GPU's
  // own node (Device::numa_node_hint) on a machine with several nodes; -1 = not bound.
  int host_node = -1;
  std::uint64_t communicator_bytes = 0;  // device memory the communicators took (Trainer::DeviceMemory)
  std::unique_ptr<Stream> compute, tp_comm;
  std::vector<std::unique_ptr<Stream>> p2p;  // one per pipeline channel, in pp_channels' order
  std::unique_ptr<BlockArena> alloc;         // the caching device allocator, capped at memory.device_budget
  // The compute stream's GEMM scratch (Stream::set_gemm_workspace, gemm_workspace_bytes of the
  // configured backend), from alloc; none on the CPU backend.
  std::shared_ptr<Storage> gemm_workspace;
  // The compute stream's attention-library scratch (Stream::set_attention_workspace,
  // attention_library_workspace_bytes of the config), from alloc; none on the CPU backend.
  std::shared_ptr<Storage> attention_workspace;
  std::unique_ptr<PinnedPool> pool;  // pinned host pool (ranks whose plan offloads)
  std::unique_ptr<OffloadEngine> offload;
  OffloadCounters offload_before;        // the engine's counters at the start of this step
  double speculation_hidden_before = 0;  // RankOptimizer::Speculation::hidden_s at the last step's end
  // Parameter streaming (RankPlan::param_stream): the streamed chunks' flat buffers come from
  // param_host (pinned host memory); the streamer moves each unit's slices through the device.
  std::unique_ptr<Allocator> param_host;
  std::unique_ptr<ParamStreamer> streamer;
  ParamStreamCounters param_stream_before;     // the streamer's counters at the start of this step
  std::vector<std::unique_ptr<Stage>> stages;  // [local chunk]
  // The GEMM shapes prepared on the compute stream before step 1 (Trainer::prepared_gemms).
  std::vector<GemmShape> prepared_gemms;
  std::uint64_t late_gemm_choices_before = 0;  // Device::late_gemm_choices at this step's start
  // Whichever mechanism keeps and updates this rank's optimizer state (optim/rank_optimizer.h);
  // made before the stages (it says where their masters live), destroyed before them.
  std::unique_ptr<RankOptimizer> optimizer;
  std::vector<Tensor> checkpoint_views;  // what a checkpoint is gathering: parameters or a moment
  std::unique_ptr<Executor> executor;
  Communicator* tp = nullptr;
  // The TP group again, for the small all-reduces inside the vocab-parallel head unit (on the
  // compute stream; models/unit_common.h): its own communicator, so they never interleave with the
  // executor's all-reduces on tp. Null unless tp > 1 and parallel.vocab_parallel.
  Communicator* vocab = nullptr;
  // The pipeline channels this rank sends or receives on (schedule/p2p_groups.h), each a 2-rank
  // communicator (0 = the source, 1 = the destination).
  std::map<sched::P2pChannel, Communicator*> pp_channels;
  Communicator* dp = nullptr;       // the DP group: same pp and tp rank in every replica (dp > 1)
  Communicator* replica = nullptr;  // every rank of this replica: global grad norm, checkpoint gather
  Communicator* world = nullptr;    // every rank of the job: the step's losses
  Communicator* tied = nullptr;     // ranks holding the first and the last stage, when they differ
  // (dp · m,) the step's per-microbatch losses, slot replica · m + mb − 1: written by the last
  // stage's TP rank 0 of each replica, zero elsewhere, then summed over the world (so every rank
  // holds every loss, exactly).
  Tensor losses;
  // (3,) the step's health scalars: this replica's gradient sum of squares; the same summed over
  // every rank (finite only if every rank's is: the skip decision); the clip coefficient.
  Tensor health;
  // (eval_batches · dp · m,) validation losses, slot (pass · dp + replica) · m + mb − 1, summed over
  // the world like losses.
  Tensor eval_losses;
  std::vector<std::vector<std::int32_t>> staging;  // this step's host token buffers (until sync)

  bool holds_first() const;
  bool holds_last() const;
  Stage* first_stage() const;  // nullptr when not held
  Stage* last_stage() const;
  // Every stage's parameters (views), chunk order (the optimizer's list).
  const std::vector<ParamInfo>& params() const { return optimizer->params(); }
  // Every stream of the rank; leave_uploads: except the optimizer's streams that carry the last
  // update's uploads and all-gathers, which the next step orders on chunk by chunk (the executor's
  // params_needed hook).
  void synchronize(bool leave_uploads = false);
};

}  // namespace stp
