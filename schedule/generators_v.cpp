// ZB-V: the handcrafted zero-bubble V schedule (docs/schedules.md, Rules of the other generators; same lists as ZB's
// handcrafted_zb_v and PyTorch's ScheduleZBVZeroBubble). V placement: chunk 0 = stage r, chunk 1 = stage 2p−1−r.
#include <algorithm>
#include <deque>

#include "base/error.h"
#include "schedule/generators.h"

namespace stp::sched {

namespace {

// Builds one rank's list for n microbatches. Every backward is split (B*) and its W queued per chunk.
struct VRank {
  int n = 0;
  int f[2] = {1, 1}, b[2] = {1, 1};
  std::deque<int> pending[2];
  std::vector<Op> ops;

  void F(int c) { ops.push_back(Op::f(c, f[c]++)); }
  void B(int c) {
    ops.push_back(Op::bwd(c, b[c], true));
    pending[c].push_back(b[c]++);
  }
  void W(int c) {
    STP_ASSERT(!pending[c].empty(), "zb-v: no deferred W of chunk ", c);
    ops.push_back(Op::w(c, pending[c].front()));
    pending[c].pop_front();
  }
};

}  // namespace

// Rank r, n = max(2p−1, m) microbatches (the recipe needs 2p−1 to fill the V; ops on microbatches > m are
// then dropped, which keeps every dependency because each op's inputs have the same microbatch):
//   Step 1: 2(p−r)−1 × F0             Step 2: r × (F1, F0)          Step 3: p−r × (F1, B1*, W1)
//   Step 4 (steady, until every F ran): [F0 if any left], B0*, W0, F1, B1*, W1
//   Step 5 (cool-down): r × (B0*, B1*); then p−r × (B0*, oldest W0); then the remaining W1's, then W0's.
// Any m ≥ 1.
Schedule generate_zb_v(int pp, int m) {
  Schedule s = make_schedule("zb-v", pp, m, 2, Placement::V);
  const int n = std::max(2 * pp - 1, m);
  for (int r = 0; r < pp; ++r) {
    VRank v;
    v.n = n;
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) v.F(0);        // Step 1
    for (int i = 0; i < r; ++i) v.F(1), v.F(0);               // Step 2
    for (int i = 0; i < pp - r; ++i) v.F(1), v.B(1), v.W(1);  // Step 3
    while (v.f[1] <= n) {                                     // Step 4
      if (v.f[0] <= n) v.F(0);
      v.B(0), v.W(0), v.F(1), v.B(1), v.W(1);
    }
    for (int i = 0; i < r; ++i) v.B(0), v.B(1);  // Step 5
    for (int i = 0; i < pp - r; ++i) v.B(0), v.W(0);
    while (!v.pending[1].empty()) v.W(1);
    while (!v.pending[0].empty()) v.W(0);
    STP_ASSERT(v.f[0] == n + 1 && v.f[1] == n + 1 && v.b[0] == n + 1 && v.b[1] == n + 1, "zb-v counts");
    auto& ops = s.ranks[r];
    for (const Op& op : v.ops)
      if (op.a.mb <= m) ops.push_back(op);
  }
  return s;
}

}  // namespace stp::sched
