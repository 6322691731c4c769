// STP, the synergistic schedule (docs/schedules.md, STP op lists: the per-rank rule, offload markers), and its fallback
// for small m.
#include <algorithm>
#include <deque>

#include "base/error.h"
#include "schedule/generators.h"

namespace stp::sched {

namespace {

// One rank's list under construction: per-chunk forward/backward counters (each runs 1..m in order) and the
// deferred-W FIFO shared by both chunks (W and F&W pop the oldest entry).
struct StpRank {
  int f[2] = {1, 1}, b[2] = {1, 1};
  std::deque<ChunkMb> deferred;
  bool offload_f1 = false;  // chunk-1 forwards are offloaded only in S6 on ranks r > 0
  std::vector<Op> ops;

  bool offload(int c) const { return c == 0 || offload_f1; }  // chunk-0 activations live longest: always offload
  void F(int c) {
    Op op = Op::f(c, f[c]++);
    op.a.offload = offload(c);
    ops.push_back(op);
  }
  void FF() {
    Op op = Op::ff(0, f[0], f[0] + 1);
    f[0] += 2;
    op.a.offload = op.b.offload = offload(0);
    ops.push_back(op);
  }
  void B(int c, bool defer) {
    if (defer) deferred.push_back({c, b[c]});
    ops.push_back(Op::bwd(c, b[c]++, defer));
  }
  void FB(int c, bool defer) {
    Op op = Op::fb(c, f[c]++, c, b[c], defer);
    op.a.offload = offload(c);
    if (defer) deferred.push_back({c, b[c]});
    ++b[c];
    ops.push_back(op);
  }
  ChunkMb pop() {
    STP_ASSERT(!deferred.empty(), "stp: W with no deferred backward");
    ChunkMb w = deferred.front();
    deferred.pop_front();
    return w;
  }
  void FW(int c) {
    ChunkMb w = pop();
    Op op = Op::fw(c, f[c]++, w.chunk, w.mb);
    op.a.offload = offload(c);
    ops.push_back(op);
  }
  void W() {
    ChunkMb w = pop();
    ops.push_back(Op::w(w.chunk, w.mb));
  }
};

// The per-rank rule (docs/schedules.md, STP op lists) for rank r; needs m ≥ 3p−1. Counts are closed-form;
// the count checks listed there hold by algebra (F0: 2(p−r−1) + 2(r+1)... = m) and are asserted at the end.
std::vector<Op> stp_rank(int p, int m, int r) {
  StpRank k;
  for (int i = 0; i < 2 * (p - r - 1); ++i) k.F(0);                    // S1: 2(p−r−1) × F0
  for (int i = 0; i < r + 1; ++i) k.F(0), k.F(1);                      // S2: (r+1) × (F0, F1)
  if ((r + 1) % 2 == 1) k.F(0);                                        // S3: one F0 if r+1 is odd,
  for (int i = 0; i < (r + 1) / 2; ++i) k.FF();                        //     then ⌊(r+1)/2⌋ × F0+F0
  for (int i = 0; i < p - r - 1; ++i) k.FB(1, true), k.FW(0);          // S4: (p−r−1) × (F1&B1*, F0&W)
  const int s5 = 2 * (m - 3 * p + 1) + 1 + 2 * r;                      // S5: s5 blocks F1&B1, F0&B0, …, F1&B1;
  for (int i = 0; i < s5; ++i) k.FB(i % 2 == 0 ? 1 : 0, i >= s5 - r);  //     the last r defer their W
  k.offload_f1 = r > 0;
  for (int i = 0; i < 2 * p - r - 2; ++i) k.B(0, false), k.FB(1, true);  // S6: (2p−r−2) × (B0, F1&B1*)
  k.offload_f1 = false;
  for (int i = 0; i < r + 1; ++i) k.B(0, false), k.B(1, false);  // S7: (r+1) × (B0, B1)
  for (int slot = 0; slot < 1 + 2 * (p - r - 1); ++slot) {       // S8: B0 on even slots, W W on odd
    if (slot % 2 == 0) k.B(0, false);
    else k.W(), k.W();
  }
  for (int i = 0; i < 2 * r; ++i) k.W();  // S9: 2r × W
  STP_ASSERT(k.f[0] == m + 1 && k.f[1] == m + 1 && k.b[0] == m + 1 && k.b[1] == m + 1 && k.deferred.empty(),
             "stp rule broken for p=", p, " m=", m, " r=", r);
  return std::move(k.ops);
}

// Keeps the parts whose microbatch maps to a new number (new_mb[j] > 0) and renumbers them: F&B → the
// surviving F or B, F+F → F, F&W → F or W. Each W names its own (chunk, microbatch), so the deferred-W FIFO
// stays consistent: survivors keep their relative order.
std::vector<Op> keep_microbatches(const std::vector<Op>& ops, const std::vector<int>& new_mb) {
  auto single = [](Pass p) { return p == Pass::F ? OpKind::F : p == Pass::B ? OpKind::B : OpKind::W; };
  std::vector<Op> out;
  for (const Op& op : ops) {
    bool keep_a = new_mb[op.a.mb] > 0, keep_b = op.braided() && new_mb[op.b.mb] > 0;
    Op t = op;
    t.reload.clear();
    t.a.mb = new_mb[op.a.mb];
    if (op.braided()) t.b.mb = new_mb[op.b.mb];
    if (keep_a && !keep_b) t.kind = single(t.a.pass), t.b = Part{};
    if (!keep_a && keep_b) t.a = t.b, t.kind = single(t.a.pass), t.b = Part{};
    if (keep_a || keep_b) out.push_back(t);
  }
  return out;
}

// The fallback keeps microbatches 1..m of the 3p−1 schedule and drops the rest (docs/schedules.md, STP for 2p ≤ m <
// 3p−1). We also measured every other contiguous window of dropped microbatches (unit costs, p ∈ {2, 3, 4, 8}):
// dropping the lowest ones is within ±1 time unit of this, any window in the middle is about twice as bad (it breaks
// the steady F&B chain in two), so dropping the highest microbatches stays.
std::vector<int> fallback_numbering(int rule_m, int m) {
  std::vector<int> new_mb(rule_m + 1, 0);
  for (int j = 1; j <= m; ++j) new_mb[j] = j;
  return new_mb;
}

// Reload markers (docs/schedules.md, STP op lists, Offload markers): the H2D copy of an offloaded forward's activations
// starts one op before the op holding its backward (e.g. "F0.5&W1.1, reload 0.1, F1.3&B1.2, F0.6&B0.1"), never before
// the forward.
void add_reloads(std::vector<Op>& ops, int m) {
  std::vector<int> forward_op(2 * (m + 1), -1);  // [chunk·(m+1) + mb] -> index of its offloaded forward
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    for (int k = 0; k < ops[i].n_parts(); ++k) {
      const Part& part = ops[i].part(k);
      int& fwd = forward_op[part.chunk * (m + 1) + part.mb];
      if (part.pass == Pass::F && part.offload) fwd = i;
      if (part.pass == Pass::B && fwd >= 0) ops[std::max(i - 1, fwd + 1)].reload.push_back({part.chunk, part.mb});
    }
  }
}

}  // namespace

// m ≥ 3p−1: the per-rank rule (docs/schedules.md, STP op lists). 2p ≤ m < 3p−1: the rule cannot run
// (S1–S4 alone issue 3p−r−1 chunk-0 forwards), so we generate for m' = 3p−1 and drop the microbatches above m.
// The result keeps STP's braiding for the microbatches that remain. Its bubble (unit costs, no comm) is
// p=2 m=4: 4 (vs 1 at m ≥ 5); p=4 m=8/9/10: 10/9/6 (vs 3); p=8 m=16/20/22: 22/16/10 (vs 7) —
// docs/schedules.md, tests/schedule/table1_test.cpp.
Schedule generate_stp(int pp, int m) {
  STP_CHECK(m >= 2 * pp, "schedule 'stp' needs at least 2p = ", 2 * pp, " microbatches for pp ", pp, ", got ", m);
  const int rule_m = std::max(m, stp_rule_min_microbatches(pp));
  Schedule s = make_schedule("stp", pp, m, 2, Placement::V);
  for (int r = 0; r < pp; ++r) {
    std::vector<Op> ops = stp_rank(pp, rule_m, r);
    if (rule_m != m) ops = keep_microbatches(ops, fallback_numbering(rule_m, m));
    add_reloads(ops, m);
    s.ranks[r] = std::move(ops);
  }
  return s;
}

}  // namespace stp::sched
