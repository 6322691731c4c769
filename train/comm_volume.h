// The analytic communication volume of a training config: bytes each rank sends per optimizer step,
// by kind, as Trainer::comm_bytes measures them (Communicator::bytes_sent: an all-reduce counts the
// rank's buffer once, a send its bytes). Benchmarked against the measurement by tools/bench/bench_comm
// and asserted equal in tests/train/comm_volume_test.cpp.
//
// Notation: B = micro_batch_size, T = seq_len, C = n_embd, V = vocab_size, L = n_layer,
// m = microbatches, d = dp, p = pp, t = tp, v = the schedule's chunks per rank; a = 4·B·T·C
// (one activation of a microbatch: a pipeline message, or one TP all-reduce). For rank
// (dp_rank, pp rank r, tp rank):
//
//   TP    = [t > 1] · 4 · m · (L / p) · a
//           (attention and MLP each all-reduce once in F and once in B; L / p layers per rank)
//           + with vocab parallelism (parallel.vocab_parallel, t > 1) m · a on the rank of the first
//           stage (the embedding's output) and m · (4·B·T + 8·B·T + a + g) on the rank of the last
//           (the head's max and [sum-exp | target logit] all-reduces in F; in B its input gradient
//           and the final norm's weight-gradient partials, g = 4 · the final norm's parameters,
//           Architecture::final_norm_params in models/registry.h); V·C below is then Vr·C,
//           Vr = ceil(V / t) rows of the embedding and the head per rank
//   PP    = [p > 1] · m · a · (f + b), the cross-rank sends per microbatch:
//             interleaved placement: f = v − [r = p − 1],  b = v − [r = 0]
//             V placement:           f = b = [r ≠ p − 1] + [r ≠ 0]   (the V's turn is local)
//   DP    = [d > 1] · 4 · P_r, P_r = the parameters of the rank's stages as the architecture
//           counts them (Architecture::stage_params, StageParamCount::all: this TP rank's shards,
//           each stage's copy of a tied embedding counted)
//           With parallel.distributed_optimizer: per stage of the rank (n_s parameters, cut into
//           buckets of parallel.dp_bucket / 4) and bucket of `count`, a reduce-scatter and an
//           all-gather of 4 · (count − the rank's slice) each (core/comm.h, comm_slice), plus 4
//           for the grad norm's sum over the dp ranks when grad_clip > 0. In bf16 the stage's
//           movable GEMM weights (StageParamCount::movable: the layers' matrices, + the head's
//           weight where only the head reads it) are bucketed apart, after the rest, and their
//           all-gather moves 2 bytes per element (the bf16 copies of sharded masters)
//   other = [model.tie_embeddings, p > 1, interleaved placement, r = 0 or r = p − 1] · 4·V·C
//           (first and last stage on different ranks sum the tied embedding's gradient)
//           + norm 4 (the gradient sum of squares over the replica, every step: grad_norm and
//           the non-finite guard) + guard 4 (that sum over the world: the skip decision)
//           + losses 4 · d · m
#pragma once

#include <cstdint>

namespace stp {

struct Config;

struct CommVolume {
  std::uint64_t tp = 0, pp = 0, dp = 0, other = 0;
};

// Bytes global rank `global` sends in one step (train/rank_layout.h numbering).
CommVolume expected_comm_bytes(const Config& config, int global);

}  // namespace stp
