// Interleaved 1F1B (Megatron virtual pipeline, v = 2 chunks; docs/schedules.md, Rules of the other generators).
#include <algorithm>

#include "base/error.h"
#include "schedule/generators.h"

namespace stp::sched {

namespace {

// Megatron's forward table: microbatches in groups of g (the last group takes what is left); per group,
// chunk 0 for every microbatch of the group, then chunk 1, …. Entry k is the k-th chunk-forward.
std::vector<ChunkMb> forward_table(int m, int v, int g) {
  std::vector<ChunkMb> table;
  table.reserve(static_cast<std::size_t>(m) * v);
  for (int g0 = 1; g0 <= m; g0 += g) {
    int g1 = std::min(m, g0 + g - 1);
    for (int c = 0; c < v; ++c)
      for (int j = g0; j <= g1; ++j) table.push_back({c, j});
  }
  return table;
}

}  // namespace

// Rank r runs warm-up w_r = min(2(p−1−r) + (v−1)·g, m·v) chunk-forwards, then m·v − w_r pairs (F, B),
// then the w_r remaining backwards. The k-th backward is the k-th table entry with its chunk mirrored
// (v−1−c): backwards retrace the forwards in reverse chunk order. Group size g = p (Megatron's default),
// or m when m < p. The "2·" per hop admits enough forwards that each rank stays busy while the first
// backward travels back (Megatron-LM's reasoning for the factor 2).
//
// Group size: Megatron requires p ≤ g ≤ m and m mod g ∈ {0} ∪ [p, g), else it refuses ("dependency
// bubbles"); the condition is real — with g = p = 8 and m = 10 the short last group deadlocks. We take the
// smallest g ≥ min(p, m) that meets it (g = m always does), so any m ≥ 1 works: g = p when p divides m,
// g = m when m < p. A larger g only adds warm-up forwards (memory), never changes the steady state.
static int group_size(int pp, int m) {
  for (int g = std::min(pp, m);; ++g)
    if (m % g == 0 || m % g >= pp) return g;
}

Schedule generate_1f1b_i(int pp, int m) {
  const int v = 2;
  const int g = group_size(pp, m);
  Schedule s = make_schedule("1f1b-i", pp, m, v, Placement::Interleaved);
  std::vector<ChunkMb> table = forward_table(m, v, g);
  const int total = m * v;
  for (int r = 0; r < pp; ++r) {
    auto& ops = s.ranks[r];
    int warmup = std::min(2 * (pp - 1 - r) + (v - 1) * g, total);
    int f = 0, b = 0;
    auto forward = [&] { ops.push_back(Op::f(table[f].chunk, table[f].mb)), ++f; };
    auto backward = [&] { ops.push_back(Op::bwd(v - 1 - table[b].chunk, table[b].mb, false)), ++b; };
    for (int i = 0; i < warmup; ++i) forward();  // Step 1: warm-up
    for (int i = 0; i < total - warmup; ++i) {   // Step 2: steady (F, B)
      forward();
      backward();
    }
    for (int i = 0; i < warmup; ++i) backward();  // Step 3: cool-down
    STP_ASSERT(f == total && b == total, "1f1b-i counts");
  }
  return s;
}

}  // namespace stp::sched
