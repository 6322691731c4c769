#include "train/comm_volume.h"

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
  const bool same_stage = p * v == 1;  // one stage holds the embedding and the head
  if (d > 1) {
    std::uint64_t params = (L / p) * (12 * C * C / t + 7 * C / t + 6 * C);
    if (first) params += V * C + T * C;
    if (last) params += 2 * C + (first && same_stage ? 0 : V * C);
    out.dp = 4 * params;
  }
  if (p > 1 && !v_shape && (first || last)) out.other += 4 * V * C;  // first and last stage on different ranks
  out.other += 4 + 4;  // the gradient norm's sum over the replica, the skip decision's over the world
  out.other += 4 * d * m;
  return out;
}

}  // namespace stp
