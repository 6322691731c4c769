// The memory planner's decision ("choose levers"): per (rank, chunk, unit) keep / offload /
// recompute, and per (rank, chunk) where the optimizer lives, so that every device's predicted peak
// stays within memory.device_budget at the least predicted slowdown. A pure function of the measured
// numbers (the candidates below) and a cost model (`evaluate`): the planner tests in tests/memory drive
// it with analytic fakes (tests/memory/planner_fake.h); train/memory_planning.h with dry runs.
//
// Policy only (docs/style.md, Policy apart from mechanism). The caller supplies
//   * the candidates: which units can be offloaded or recomputed, how many bytes per microbatch
//     each lever frees, and what it costs (forward seconds re-run; bytes over the link);
//   * an evaluator that predicts every device's peaks for a set of decisions. stp's evaluator is
//     a dry run of one training process (core/cpu/dry_stream.h): the same host program with the
//     same allocation sequence, so its peaks are exactly what a real run measures.
//
// Search (policies: memory/policy.h): levers set to `none` are never used, `all` / `selective` /
// `full` are forced on every candidate, `auto` levers are added greedily. First the most the
// enabled levers can do is evaluated: if even that exceeds the budget the config is infeasible and
// min_device_budget says what would fit. Otherwise, starting from the forced decisions, each round gives every rank
// that is over budget its cheapest remaining move — cost per byte freed, where offloading costs only the copy time the
// compute of a step cannot hide and recomputing costs its forward time — and re-evaluates, until every rank fits.
//
// The optimizer placement is one more kind of move in the same search (optimizer_offload: none keeps
// every chunk's state on the device, all puts every chunk's on the host, auto chooses per (rank,
// chunk)). Moving chunk c's state to the host frees its optimizer bytes on the device (plus its
// host_masters, ModelStateBytes) and costs
//   optimizer_offload_s(c) = (3 P_c·4 B − 6 H_c B) / link  +  (28 P_c + 6 H_c) B / cpu_adamw
// (P_c: its parameters, H_c: those of them whose master moves to the host) — the parameters and
// gradients down and the parameters up (a host master: its gradient down, its bf16 copy up), the
// CPU AdamW's 28 bytes per parameter and the rounding of the host masters (a streamed chunk: the CPU term only, its
// update reads and writes the host copies in place) — counted as exposed (an upper bound: early
// downloads and the CPU update of one chunk overlap the device's other work). Its key is that cost per byte of the
// rank's deficit it covers (bytes capped at peak − budget), so the smallest chunk that covers what is left wins over a
// larger one. Once every rank fits, the host chunks are tried back on the device, dearest first, and stay there when
// every rank still fits ("the reverse").
// With optimizer_overlap a rank's optimizer_offload_s counts, of its host chunks without a tied
// parameter (ModelStateBytes::tied), only the dearest: each such chunk's update runs as soon as its
// gradients are on the host, overlapping the backward of the chunks after it, and only the last
// one's follows the rank's last backward (an upper bound: that chunk is not always the dearest). A
// chunk with a tied parameter is counted in full, as without overlap.
//   step cost of a rank = recompute_s + exposed_copy_s + optimizer_offload_s (RankPrediction).
//
// Late reloads (RankPlan::late_reloads) are the last activation lever: once a rank over budget has
// no unit move left, its offloaded sets come back at the op that reads them instead of a copy's time
// ahead, which exposes every reload (the evaluator prices it) but keeps the sets off the device while
// earlier ops run; the search then goes on from there. The strongest plan (min_device_budget) has
// late reloads on every rank whenever offload is enabled.
//
// Parameter streaming (RankPlan::param_stream, param_offload: none streams no chunk, all every
// chunk, auto chooses per (rank, chunk) in the same search). A streamed chunk's optimizer is on the
// host. Streaming chunk c is one more kind of move: it frees c's weights and gradients on the
// device (ModelStateBytes; the working set the streamer keeps is left to the evaluator) and, when
// c's optimizer is still on the device, that state too, since the move takes it to the host. Its
// cost is param_stream_seconds(c) plus optimizer_offload_seconds(c, streamed) (or, when c's
// optimizer was on the host already, minus the link copies its update no longer makes); its key is
// cost per byte of the deficit, like an optimizer move. Once every rank fits, streamed chunks are
// tried back unstreamed, dearest first, and stay so when every rank still fits. Its copies are
// priced per step by
// param_stream_seconds (P = param_stream_s of RankPrediction, part of the step cost), with W_c and
// G_c the chunk's weight and gradient bytes and m the microbatches:
//   gradients: (2 m - 1) G_c / link, every one exposed: a pass moves only the gradients it writes
//     (Stage::pass_grads), so each slice goes down once per microbatch and comes up once per
//     microbatch but the first (a pass waits for its gradients to come up, and the next pass's
//     copies queue behind their way down);
//   weights:   2 m W_c / link (one F and one B pass per unit and microbatch: W reads no weight;
//     the norm of the next unit that a B also brings is not counted), prefetched one unit
//     ahead, so hidden under the chunk's share of the rank's compute (its units' fraction of
//     compute_s) up to that share; under late parameters every weight copy is exposed.
// Late parameters (RankPlan::late_params) are the last lever of all: once a rank over budget has no
// move left, late reloads included, its streamed units' weights come at the pass that reads them
// (no prefetch of the next unit), which keeps them off the device while the previous unit's pass
// runs; the search then goes on from there. The strongest plan (min_device_budget) streams every
// chunk with late parameters whenever param_offload is enabled.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/plan.h"
#include "memory/policy.h"

namespace stp {

struct PlanCandidate {
  int pp_rank = 0, chunk = 0, unit = 0;
  std::string name;                          // "h.3.attn"
  std::size_t offload_bytes = 0;             // bytes per microbatch F leaves behind (after recompute drops)
  std::size_t selective_saving = 0;          // bytes per microbatch Selective drops (0: not supported)
  std::size_t full_saving = 0;               // bytes per microbatch Full drops (0: not supported)
  double forward_s = 0;                      // forward time of the unit per microbatch
  double selective_cost = 0, full_cost = 0;  // fraction of the forward re-run
};

struct PlannerInput {
  std::size_t device_budget = SIZE_MAX;  // bytes per device; SIZE_MAX = no limit
  OffloadPolicy offload = OffloadPolicy::Auto;
  RecomputePolicy recompute = RecomputePolicy::Auto;
  int pp = 1;
  int tp = 1;  // global rank = pp_rank * tp + tp_rank
  int microbatches = 1;
  std::vector<std::vector<int>> units;  // [pp rank][local chunk] unit count
  std::vector<PlanCandidate> candidates;
  // [pp rank][local chunk]: model-state bytes of each chunk (TP rank 0). The optimizer placement
  // is chosen per chunk from these (optimizer_offload).
  std::vector<std::vector<ModelStateBytes>> chunk_states;
  OffloadPolicy optimizer_offload = OffloadPolicy::None;  // where each chunk's optimizer state may live
  double link_bytes_per_s = 1;                            // D2H / H2D rate (each direction)
  double cpu_adamw_bytes_per_s = 20e9;                    // the CPU AdamW's streaming rate
  // memory.optimizer_overlap: the host chunks' updates run during the backward; a rank's exposed
  // optimizer time then counts only the dearest of its chunks without a tied parameter (the last
  // one's update follows the last backward), not their sum.
  bool optimizer_overlap = false;
  // memory.param_offload: none / all / auto (RankPlan::param_stream on no chunk / every chunk / the
  // chunks the budget needs; a streamed chunk's optimizer is on the host, so streaming requires
  // optimizer_offload other than none).
  OffloadPolicy param_offload = OffloadPolicy::None;
  // Fills each plan's prefetch points and returns predictions [global rank] (RankPlan::optimizer
  // says where each chunk's optimizer lives; the planner adds optimizer_offload_s itself).
  std::function<std::vector<RankPrediction>(std::vector<RankPlan>&)> evaluate;
  // Optional: the smallest budget in which the allocator can place `plans` (prefetches filled by
  // evaluate), at least `live_peak` (their largest live-byte peak). It turns the levers' live-byte
  // minimum into the minimum feasible budget; without it (or when it returns `live_peak` unchecked,
  // as a cheap lower bound) the live-byte peak is used.
  std::function<std::size_t(const std::vector<RankPlan>& plans, std::size_t live_peak)> placeable_budget;
};

MemoryPlan plan_memory(const PlannerInput& in);

// Seconds per step the planner charges for one chunk's optimizer state on the host (the formula
// above), from its model-state bytes. A streamed chunk (RankPlan::param_stream) is updated in place
// in pinned host memory: only the CPU term (its link copies are the streamer's, priced as copies).
double optimizer_offload_seconds(const PlannerInput& in, const ModelStateBytes& chunk, bool streamed = false);

// Seconds per step the planner charges for streaming one chunk (the model above): `compute_share_s`
// is the compute its prefetched weight copies hide under; `late`: RankPlan::late_params (nothing
// hides). It prices the streaming move of the search, before a dry run has counted the copies.
double param_stream_seconds(const PlannerInput& in, const ModelStateBytes& chunk, double compute_share_s, bool late);

// The same price from the copies a dry run counted (the stream_* bytes of `p`), given the rank's
// compute time p.compute_s; what RankPrediction::param_stream_s holds once the evaluator measured them:
//   (grads up + grads down) / link  +  max(0, weights up / link − compute_s)   (late: no max)
// A pass's weights come up one unit ahead (the executor prefetches the next unit of the same part
// while this one computes), so they hide under compute up to the compute of a step; under late
// parameters nothing is prefetched and every weight copy is exposed. The gradients cannot hide:
// they come up only after the previous pass sent them back, on the same in-order copy stream that
// waits on compute, so compute waits for both directions (an upper bound: the last pass of a part
// sends its gradients back while the next op computes). 0 without streaming.
double streaming_exposed_seconds(const RankPrediction& p, double link_bytes_per_s, bool late);

// Why an infeasible plan (plan_memory's feasible == false; its predictions are those of the
// strongest plan) cannot fit: the worst device's peak and what remains of it once every enabled
// lever is used — weights, gradients, optimizer state, the activations no lever moves, buffers and
// workspace — and the minimum feasible budget (rounded up when Human: setting it fits). Every size
// once, in `style` (base/error.h, format_bytes).
std::string describe_infeasible(const MemoryPlan& plan, ByteStyle style = ByteStyle::Human);

}  // namespace stp
