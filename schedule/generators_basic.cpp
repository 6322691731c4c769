// Single-chunk schedules (stage r on rank r): GPipe, 1F1B and ZB-H1 (docs/schedules.md, Rules of the other generators).
#include <deque>

#include "base/error.h"
#include "schedule/generators.h"

namespace stp::sched {

// GPipe: every forward, then every backward (W fused), both in microbatch order. Any m ≥ 1.
Schedule generate_gpipe(int pp, int m) {
  Schedule s = make_schedule("gpipe", pp, m, 1, Placement::Interleaved);
  for (auto& ops : s.ranks) {
    for (int j = 1; j <= m; ++j) ops.push_back(Op::f(0, j));
    for (int j = 1; j <= m; ++j) ops.push_back(Op::bwd(0, j, false));
  }
  return s;
}

// 1F1B (PipeDream-flush). Rank r: warm-up w = min(p−1−r, m) forwards; steady m−w pairs (F, B);
// cool-down the w remaining backwards. Any m ≥ 1.
Schedule generate_1f1b(int pp, int m) {
  Schedule s = make_schedule("1f1b", pp, m, 1, Placement::Interleaved);
  for (int r = 0; r < pp; ++r) {
    auto& ops = s.ranks[r];
    int warmup = std::min(pp - 1 - r, m);
    int f = 1, b = 1;
    for (int i = 0; i < warmup; ++i) ops.push_back(Op::f(0, f++));  // Step 1: w × F
    for (int i = 0; i < m - warmup; ++i) {                          // Step 2: (m−w) × (F, B)
      ops.push_back(Op::f(0, f++));
      ops.push_back(Op::bwd(0, b++, false));
    }
    for (int i = 0; i < warmup; ++i) ops.push_back(Op::bwd(0, b++, false));  // Step 3: w × B
    STP_ASSERT(f == m + 1 && b == m + 1, "1f1b counts");
  }
  return s;
}

// ZB-H1: 1F1B's order with every backward split into B* and W; rank r keeps up to r W's pending, so
// W(j) runs right after B(j+r) (rank 0 runs each W right after its B), and the last r W's fill the tail.
// Splitting lets the backward wave move T_W faster per hop; holding r W's on rank r puts them where the
// cool-down of 1F1B idles. Memory stays at 1F1B's p·M_B. Any m ≥ 1.
Schedule generate_zb_h1(int pp, int m) {
  Schedule s = make_schedule("zb-h1", pp, m, 1, Placement::Interleaved);
  for (int r = 0; r < pp; ++r) {
    auto& ops = s.ranks[r];
    std::deque<int> pending;  // microbatches whose W is deferred
    int f = 1, b = 1;
    auto backward = [&] {
      ops.push_back(Op::bwd(0, b, true));
      pending.push_back(b++);
      if (static_cast<int>(pending.size()) > r) {
        ops.push_back(Op::w(0, pending.front()));
        pending.pop_front();
      }
    };
    int warmup = std::min(pp - 1 - r, m);
    for (int i = 0; i < warmup; ++i) ops.push_back(Op::f(0, f++));  // Step 1: w × F
    for (int i = 0; i < m - warmup; ++i) {                          // Step 2: (m−w) × (F, B*, W if > r pending)
      ops.push_back(Op::f(0, f++));
      backward();
    }
    for (int i = 0; i < warmup; ++i) backward();       // Step 3: w × (B*, W if > r pending)
    for (int j : pending) ops.push_back(Op::w(0, j));  // Step 4: flush the pending W's
    STP_ASSERT(f == m + 1 && b == m + 1, "zb-h1 counts");
  }
  return s;
}

}  // namespace stp::sched
