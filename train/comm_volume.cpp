#include "train/comm_volume.h"

#include <algorithm>
#include <functional>

#include "config/config.h"
#include "base/error.h"
#include "models/registry.h"
#include "schedule/schedule.h"
#include "train/rank_layout.h"
#include "train/stage_layout.h"

namespace stp {

namespace {

// Bytes one rank sends per step over the DP group (dp > 1): the all-reduce of every gradient, or
// with the distributed optimizer per stage (chunk) and bucket a reduce-scatter and an all-gather.
// stage_params(chunk): the parameters of the rank's stage `chunk`, as the architecture counts them.
std::uint64_t data_parallel_bytes(const Config& c, int dp_rank,
                                  const std::function<StageParamCount(int chunk)>& stage_params) {
  const sched::Schedule s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  const std::uint64_t d = static_cast<std::uint64_t>(c.parallel.dp);
  if (!c.parallel.distributed_optimizer) {
    std::uint64_t params = 0;
    for (int ch = 0; ch < s.chunks; ++ch) params += static_cast<std::uint64_t>(stage_params(ch).all);
    return 4 * params;
  }
  std::uint64_t out = 0;
  const std::uint64_t per_bucket = c.parallel.dp_bucket ? *c.parallel.dp_bucket / 4 : 0;
  const std::uint64_t me = static_cast<std::uint64_t>(dp_rank);
  for (int ch = 0; ch < s.chunks; ++ch) {
    const StageParamCount held = stage_params(ch);
    const std::uint64_t n = static_cast<std::uint64_t>(held.all);
    // bf16: the movable GEMM weights have sharded masters; they come last and their buckets
    // all-gather bf16 copies.
    const std::uint64_t tail = c.train.precision == "bf16" ? static_cast<std::uint64_t>(held.movable) : 0;
    for (auto [len, gathered] : {std::pair{n - tail, std::uint64_t{4}}, std::pair{tail, std::uint64_t{2}}}) {
      for (std::uint64_t at = 0; at < len;) {
        const std::uint64_t count = per_bucket == 0 ? len - at : std::min(per_bucket, len - at);
        const std::uint64_t own = count * (me + 1) / d - count * me / d;
        out += (4 + gathered) * (count - own);
        at += count;
      }
    }
  }
  if (c.train.grad_clip > 0) out += 4;  // the norm's sum of squares over the dp ranks
  return out;
}

}  // namespace

CommVolume expected_comm_bytes(const Config& c, int global) {
  const RankLayout l = RankLayout::of(c);
  STP_ASSERT(global >= 0 && global < l.size(), "rank ", global, " of ", l.size());
  const sched::Schedule s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  const std::uint64_t B = c.train.micro_batch_size, T = c.model.seq_len, C = c.model.n_embd, V = c.model.vocab_size,
                      L = c.model.n_layer, m = c.train.microbatches, d = l.dp, p = l.pp, t = l.tp,
                      v = static_cast<std::uint64_t>(s.chunks);
  const int r = l.pp_rank(global), tp_rank = l.tp_rank(global);
  const ModelSpec model = model_spec_of(c);
  const Architecture& arch = find_architecture(model.arch);
  const std::uint64_t a = 4 * B * T * C;
  const bool v_shape = s.placement == sched::Placement::V;
  auto is = [](bool b) -> std::uint64_t { return b ? 1 : 0; };

  // Vocab parallelism: the embedding and the head hold Vr rows per rank.
  const bool vocab = c.parallel.vocab_parallel && t > 1;
  const std::uint64_t Vr = vocab ? (V + t - 1) / t : V;

  CommVolume out;
  if (t > 1) out.tp = 4 * m * (L / p) * a;
  if (p > 1) {
    std::uint64_t f = v_shape ? is(r != l.pp - 1) + is(r != 0) : v - is(r == l.pp - 1);
    std::uint64_t b = v_shape ? is(r != l.pp - 1) + is(r != 0) : v - is(r == 0);
    out.pp = m * a * (f + b);
  }
  // Stages on this rank: the first (stage 0) is on rank 0; the last on rank 0 (V) or p − 1.
  const bool first = r == 0;
  const bool last = v_shape ? r == 0 : r == l.pp - 1;
  if (vocab && first) out.tp += m * a;  // the embedding's output
  // The head: in F the max and [sum-exp | target]; in B the input gradient and the final norm's
  // weight-gradient partials.
  const std::uint64_t norm_grads = 4 * static_cast<std::uint64_t>(arch.final_norm_params(model));
  if (vocab && last) out.tp += m * (4 * B * T + 8 * B * T + a + norm_grads);
  // The parameters of each stage (chunk) of this rank, as the architecture counts them.
  auto stage_params = [&](int chunk) { return arch.stage_params(model, stage_spec_of(c, s, r, chunk, tp_rank)); };
  if (d > 1) out.dp = data_parallel_bytes(c, l.dp_rank(global), stage_params);
  // A tied embedding whose first and last stage are on different ranks: its gradients are summed.
  if (model.tie_embeddings && p > 1 && !v_shape && (first || last)) out.other += 4 * Vr * C;
  out.other += 4 + 4;  // the gradient norm's sum over the replica, the skip decision's over the world
  out.other += 4 * d * m;
  return out;
}

}  // namespace stp
