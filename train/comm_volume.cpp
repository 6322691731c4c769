#include "train/comm_volume.h"

#include <algorithm>

#include "config/config.h"
#include "base/error.h"
#include "schedule/schedule.h"
#include "train/rank_layout.h"

namespace stp {

CommVolume expected_comm_bytes(const Config& c, int global) {
  const RankLayout l = RankLayout::of(c);
  STP_ASSERT(global >= 0 && global < l.size(), "rank ", global, " of ", l.size());
  const sched::Schedule s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  const std::uint64_t B = c.train.micro_batch_size, T = c.model.seq_len, C = c.model.n_embd, V = c.model.vocab_size,
                      L = c.model.n_layer, m = c.train.microbatches, d = l.dp, p = l.pp, t = l.tp,
                      v = static_cast<std::uint64_t>(s.chunks);
  const int r = l.pp_rank(global);
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
  const bool same_stage = p * v == 1;   // one stage holds the embedding and the head
  if (vocab && first) out.tp += m * a;  // the embedding's output
  // The head: in F the max and [sum-exp | target]; in B the input gradient and the final norm's
  // weight-gradient partials (LayerNorm weight and bias, RMSNorm weight).
  const std::uint64_t norm_grads = 4 * (c.model.arch == "llama" ? C : 2 * C);
  if (vocab && last) out.tp += m * (4 * B * T + 8 * B * T + a + norm_grads);
  if (d > 1 && !(c.parallel.distributed_optimizer)) {
    std::uint64_t params = (L / p) * (12 * C * C / t + 7 * C / t + 6 * C);
    if (first) params += Vr * C + T * C;
    if (last) params += 2 * C + (first && same_stage ? 0 : Vr * C);
    out.dp = 4 * params;
  } else if (d > 1) {  // per stage (chunk) of this rank and bucket: reduce-scatter + all-gather
    const std::uint64_t stages = p * v, per_bucket = c.parallel.dp_bucket ? *c.parallel.dp_bucket / 4 : 0;
    const std::uint64_t me = static_cast<std::uint64_t>(l.dp_rank(global));
    for (std::uint64_t st = 0; st < stages; ++st) {
      if (sched::rank_of_stage(s, static_cast<int>(st)) != r) continue;
      std::uint64_t n = (L / stages) * (12 * C * C / t + 7 * C / t + 6 * C);
      if (st == 0) n += Vr * C + T * C;
      if (st == stages - 1) n += 2 * C + (stages == 1 ? 0 : Vr * C);
      // bf16: the GEMM weights (the tied wte of a last stage that is not the first too) have
      // sharded masters; they come last and their buckets all-gather bf16 copies.
      std::uint64_t tail = 0;
      if (c.train.precision == "bf16") {
        tail = (L / stages) * 12 * C * C / t;
        if (st == stages - 1 && stages != 1) tail += Vr * C;
      }
      for (auto [len, gathered] : {std::pair{n - tail, std::uint64_t{4}}, std::pair{tail, std::uint64_t{2}}}) {
        for (std::uint64_t at = 0; at < len;) {
          const std::uint64_t count = per_bucket == 0 ? len - at : std::min(per_bucket, len - at);
          const std::uint64_t own = count * (me + 1) / d - count * me / d;
          out.dp += (4 + gathered) * (count - own);
          at += count;
        }
      }
    }
    if (c.train.grad_clip > 0) out.dp += 4;  // the norm's sum of squares over the dp ranks
  }
  if (p > 1 && !v_shape && (first || last)) out.other += 4 * Vr * C;  // first and last stage on different ranks
  out.other += 4 + 4;  // the gradient norm's sum over the replica, the skip decision's over the world
  out.other += 4 * d * m;
  return out;
}

}  // namespace stp
