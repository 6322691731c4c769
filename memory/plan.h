// A memory plan: per rank, what happens to each unit's activation records between its forward
// and its backward (keep, offload to pinned host memory, recompute), when offloaded sets are
// prefetched, and what the planner predicts. Made by memory/planner.h, carried out by the
// executor (train/executor.h), the offload engine (offload/) and the model (Stage::set_recompute).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/block_arena.h"
#include "memory/recompute.h"

namespace stp {

struct UnitPlan {
  Recompute recompute = Recompute::None;
  bool offload = false;  // move the records F leaves behind (after any recompute drops) to host
};

// Where a chunk's optimizer state lives and its update runs. Every chunk is on the device today; the
// optimizer-offload lever (pinned host state, CPU AdamW) is one more decision of the same plan.
enum class OptimizerPlacement : std::uint8_t { Device, Host };
const char* to_string(OptimizerPlacement p);  // "device" | "host"

// Model-state bytes (of one chunk, or of one device): parameters (with any low-precision compute
// copies), their gradients, and the optimizer's state (AdamW m and v, and f32 masters under bf16).
struct ModelStateBytes {
  std::size_t weights = 0, gradients = 0, optimizer = 0;
  // Part of `weights`: the f32 masters that leave the device with the chunk's optimizer state (bf16
  // precision without the distributed optimizer: the masters of the GEMM weights, optim/host_update.h).
  std::size_t host_masters = 0;
  // Holds a tied parameter: its gradients are final only after the tied sum that follows the
  // backward, so its CPU update cannot start early (memory.optimizer_overlap).
  bool tied = false;
  std::size_t total() const { return weights + gradients + optimizer; }
};

struct PrefetchPoint {
  int chunk = 0, mb = 0;  // the activation set (local chunk, 1-based microbatch)
  bool weight = false;    // its W-only records (a deferred W; the first unit W walks), not what B reads
};

// One pipeline rank's decisions (every TP rank of it runs the same plan).
struct RankPlan {
  std::vector<std::vector<UnitPlan>> units;          // [local chunk][unit]
  std::vector<std::vector<PrefetchPoint>> prefetch;  // [op index]: sets to prefetch before the op
  std::vector<OptimizerPlacement> optimizer;         // [local chunk]; empty: every chunk on the device
  // Late reloads: each offloaded set comes back unit by unit, at the backward of the unit that
  // reads it, not a copy's time ahead, so it does not sit on the device while earlier ops and
  // units run; its H2D copies are then exposed. The planner's last activation lever
  // (memory/planner.h).
  bool late_reloads = false;
  // Parameter streaming (memory.param_offload), [local chunk]; empty: none. A streamed chunk keeps
  // its weights, bf16 copies and gradients in pinned host memory and brings each unit's slices to
  // the device for the passes that read them (offload/param_streamer.h). Its optimizer is on the
  // host (the CPU AdamW updates the host copies in place).
  std::vector<bool> param_stream;
  // Late parameters: each streamed unit's weights come to the device at the pass that reads them,
  // not prefetched one unit ahead, so they do not sit on the device while the previous unit's pass
  // runs; every weight copy is then exposed. The planner's last lever (memory/planner.h).
  bool late_params = false;
  // Tokens per chunk of the loss head on this rank's last stage (Stage::set_loss_chunk_tokens);
  // 0: unchunked. model.loss_chunk_tokens, or auto's choice (train/loss_chunk.h).
  std::int64_t loss_chunk_tokens = 0;
  // Sequence groups of the tiled backward of this rank's full-recompute units (Stage::set_unit_tiles);
  // 1: untiled. memory.unit_tiles, or auto's choice (train/unit_tiles.h).
  int unit_tiles = 1;
  // How the rank's device arena places blocks (memory/block_arena.h). Placement moves no live
  // byte, only the gaps between them: the planner keeps, per rank, the policy whose dry run
  // places the plan in the least memory (train/memory_planning.cpp).
  BlockPlacement block_placement = BlockPlacement::BestFit;
  // BlockPlacement::Planned: the offsets of every allocation of the rank's devices (its TP ranks
  // allocate alike), from the dry run's trace of this plan (memory/placement_table.h).
  std::shared_ptr<const PlacementTable> placement_table;
  bool offloads() const;
  OptimizerPlacement optimizer_placement(int chunk) const;
  bool streams_params(int chunk) const;
  bool streams_any() const;
};

// What the planner predicts for one device (global rank).
struct RankPrediction {
  std::size_t peak_device_bytes = 0;  // live bytes of the caching allocator: exact on every backend
  std::size_t peak_reserved_bytes = 0;
  std::array<std::size_t, kMemoryCategories> peak_by_category{};
  std::size_t host_pinned_bytes = 0;         // peak pool bytes this device's offload needs
  std::uint64_t offload_bytes_per_step = 0;  // D2H bytes (= H2D bytes)
  double compute_s = 0;                      // estimated compute time per step (FLOPs / rate)
  double recompute_s = 0;                    // added forward work per step
  double exposed_copy_s = 0;                 // copy time per step the compute cannot hide
  // Parameter streaming's copies per step (RankPlan::param_stream; 0 without it): the weights
  // brought up, the gradients brought up (accumulation over microbatches) and sent back down.
  // param_stream_s prices them (streaming_exposed_seconds, memory/planner.h).
  std::uint64_t stream_weights_up_bytes = 0, stream_grads_up_bytes = 0, stream_grads_down_bytes = 0;
  // Model states from the dry run at the end of the second step (the steady state); optimizer
  // offload moves the optimizer's bytes to the host (train/memory_planning.cpp).
  std::size_t weight_bytes = 0, grad_bytes = 0;  // on the device
  std::size_t optimizer_device_bytes = 0;        // AdamW moments on the device
  std::size_t optimizer_host_bytes = 0;          // moments + staging in pinned host memory
  std::size_t host_master_bytes = 0;             // of those: the f32 masters that moved with them
  std::size_t optimizer_shadow_bytes = 0;        // of those: the speculation's shadows (optimizer overlap)
  // Parameter streaming: the streamed chunks' weights (f32 and bf16 copies) and gradients in pinned
  // host memory (RankPlan::param_stream).
  std::size_t streamed_weight_bytes = 0, streamed_grad_bytes = 0;
  // Model states by where they live, as the report pass shows them: on the device the dry run's
  // bytes of each category at the peak; on the host the pinned optimizer state of the chunks
  // placed there; and the CPU optimizer's time per step.
  ModelStateBytes device_states, host_states;
  double cpu_optimizer_s = 0;
  // The planner's price of the chunks whose optimizer is on the host (memory/planner.h): their
  // parameter and gradient copies over the link plus the CPU AdamW, counted as exposed.
  double optimizer_offload_s = 0;
  // The planner's price of the streamed chunks' copies (memory/planner.h: streaming_exposed_seconds
  // of the bytes above when the evaluator counted them, else param_stream_seconds): the gradients'
  // round trips and the weight copies compute does not hide (all of them under late_params).
  double param_stream_s = 0;
  double step_cost_s() const { return recompute_s + exposed_copy_s + optimizer_offload_s + param_stream_s; }
};

struct MemoryPlan {
  bool feasible = true;
  std::size_t device_budget = SIZE_MAX;
  std::size_t min_device_budget = 0;      // the smallest budget any plan of this config fits ...
  bool min_budget_exact = false;          // ... or, when false, a lower bound of it (live bytes)
  std::vector<RankPlan> ranks;            // [pp rank]
  bool optimizer_offload = false;         // some chunk's AdamW state in pinned host memory (RankPlan::optimizer)
  bool optimizer_overlap = false;         // host chunks' CPU updates speculate (memory.optimizer_overlap)
  std::vector<RankPrediction> predicted;  // [global rank]
  std::string summary;                    // one line per decision group, for people
};

}  // namespace stp
