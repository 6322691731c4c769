// The tiled unit backward (Stage::set_unit_tiles) against the untiled one, for gpt2 and llama, on
// 1 and 2 TP ranks, naive and fused attention, f32 and bf16, every attention and MLP unit under
// Recompute::Full, two microbatches in flight (F of both, then B and W of each).
//
// The microbatch is B = 4 sequences of T = 24 tokens (N = 96 rows), tiled in 2 and 4 groups of 48
// and 24 rows: the group boundaries are where the CPU GEMM's row tiles are (OpenBLAS's 24-row SGEMM
// tiles on Haswell kernels; one BLAS thread, set here: tests/models/loss_chunk_test.cpp says why),
// so every GEMM whose rows are the group's rows (the recompute's column-parallel GEMM, B's input
// gradients) computes each row by the same arithmetic as untiled, attention and the norms are per
// sequence and per row, and the recomputed records and the returned gradient rows are bitwise.
//
// What must hold, and why:
//  * every microbatch's loss bitwise (memcmp): F is not tiled;
//  * every gradient bitwise except the branch GEMMs' weights and biases: the norm weights' gradients
//    are summed over all rows in B(u-1) from bitwise inputs, the embedding's and the head's do not
//    see the tiling, and the input gradients are per row;
//  * the branch weights' and biases' gradients (column- and row-parallel weights, their biases) add
//    the same terms — products act[n,i]·dy[n,j] (a bias: dy[n,j]) over the rows n of both
//    microbatches — in another order: group by group (each group's GEMM or canonical column sum,
//    core/reduce_order.h, then added to the gradient) instead of one GEMM or column sum over all
//    rows. Any summation order of n terms x_i in f32 (products fused or rounded once) is within
//    γ_n·Σ|x_i| of the exact sum, γ_n = n·u / (1 - n·u), u = 2^-24, so two orders are within
//    2·γ_n·Σ|x_i| of each other, n = 2·96 rows here. The test computes Σ|x_i| per element from the
//    untiled run's own records (act, dact, ln.out and dy after each branch's B, before its W; under
//    bf16 the row-parallel bias sums the f32 dy, whose terms are bounded by the bf16 record's
//    |dy|/(1 - 2^-8)) and checks every element of every rank's shard against that bound.
//  * a tiled unit's W adds nothing (B ran it) and leaves B(u-1) exactly the records the untiled W
//    leaves: the norm's input and statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tests/models/reorder_test_util.h"

namespace stp::testing {
namespace {

using i64 = std::int64_t;

struct Case {
  const char* arch;
  int tp;
  AttentionKernel attention;
  DType precision;
};

ModelSpec model_of(const Case& c) {
  ModelSpec m = small_model(c.arch, 24, c.precision);
  m.attention = c.attention;
  return m;
}

constexpr int kBatch = 4, kMicrobatches = 2;  // N = 96 rows per microbatch
constexpr float kLossScale = 0.75f;

std::vector<float> ids(const ModelSpec& m, int mb, bool targets) { return seeded_ids(m, kBatch, mb, targets); }

bool is_branch(Stage& st, int u) { return st.unit_kind(u) == UnitKind::Attn || st.unit_kind(u) == UnitKind::Mlp; }

bool ends_with(const std::string& s, const char* tail) { return s.ends_with(tail); }

// Unit u's record `name` (unit-relative) as f32 (the untiled run, after B and before W).
std::vector<float> unit_record(Stage& st, int u, int mb, const std::string& name, Stream& s) {
  return record_values(st, u, mb, st.unit_name(u) + "." + name, s);
}

struct Result {
  std::vector<std::vector<float>> losses;                 // [mb][rank]
  std::map<std::string, std::vector<float>> grads;        // "rank/name": the rank's shard
  std::map<std::string, std::vector<double>> abs_terms;   // Σ|x_i| per element (untiled run)
  std::vector<std::vector<std::string>> records_after_w;  // tiled: a branch's record names after W
};

// abs[i·cols + j] += Σ_n |a[n,i]|·|b[n,j]| (a: rows x ra, b: rows x cols); a empty: Σ_n |b[n,j]|.
void add_products(std::vector<double>& abs, const std::vector<float>& a, const std::vector<float>& b, i64 cols,
                  double scale = 1.0) {
  const i64 rows = static_cast<i64>(b.size()) / cols, ra = a.empty() ? 1 : static_cast<i64>(a.size()) / rows;
  if (abs.empty()) abs.assign(static_cast<std::size_t>(ra * cols), 0.0);
  for (i64 n = 0; n < rows; ++n)
    for (i64 i = 0; i < ra; ++i) {
      const double x = a.empty() ? 1.0 : std::fabs(static_cast<double>(a[static_cast<std::size_t>(n * ra + i)]));
      for (i64 j = 0; j < cols; ++j)
        abs[static_cast<std::size_t>(i * cols + j)] +=
            scale * x * std::fabs(static_cast<double>(b[static_cast<std::size_t>(n * cols + j)]));
    }
}

// The terms of branch u's weight and bias gradients on every rank, from the untiled run's records.
void add_branch_terms(TpGroup& g, const Case& c, int u, int mb, Result& out) {
  const bool attn = g.stage().unit_kind(u) == UnitKind::Attn;
  const std::string act_name = attn ? "y" : std::string(c.arch) == "gpt2" ? "gelu" : "act";
  const std::string dact_name = attn ? "dqkv" : "dh";
  const double bf16_dy = c.precision == DType::Bf16 ? 1.0 / (1.0 - std::ldexp(1.0, -8)) : 1.0;
  for (int r = 0; r < g.tp(); ++r) {
    Stage& st = g.stage(r);
    const std::vector<float> act = unit_record(st, u, mb, act_name, g.compute(r));
    const std::vector<float> dact = unit_record(st, u, mb, dact_name, g.compute(r));
    const std::vector<float> ln = unit_record(st, u, mb, "ln.out", g.compute(r));
    const std::vector<float> dy = unit_record(st, u, mb, "dy", g.compute(r));
    const i64 C = 32, iw = static_cast<i64>(dact.size() / (ln.size() / C));
    for (ParamInfo* p : st.unit_params(u)) {
      const std::string& n = p->name;
      auto abs_of = [&]() -> std::vector<double>& { return out.abs_terms[std::to_string(r) + "/" + n]; };
      if (ends_with(n, "c_attn.weight") || ends_with(n, "c_fc.weight") || ends_with(n, "qkv_proj.weight") ||
          ends_with(n, "gate_up_proj.weight"))
        add_products(abs_of(), ln, dact, iw);
      else if (ends_with(n, "c_attn.bias") || ends_with(n, "c_fc.bias") || ends_with(n, "qkv_proj.bias"))
        add_products(abs_of(), {}, dact, iw);
      else if (ends_with(n, "c_proj.weight") || ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight"))
        add_products(abs_of(), act, dy, C);
      else if (ends_with(n, "c_proj.bias")) add_products(abs_of(), {}, dy, C, bf16_dy);
    }
  }
}

Result run(const Case& c, int tiles) {
  const ModelSpec m = model_of(c);
  TpGroup g(m, StageSpec{0, m.n_layer, 0, c.tp, kBatch}, c.tp);
  const int U = g.num_units();
  for (int r = 0; r < g.tp(); ++r) {
    g.stage(r).init_random(42, g.compute(r));
    for (int u = 0; u < U; ++u)
      if (is_branch(g.stage(r), u)) g.stage(r).set_recompute(u, Recompute::Full);
    g.stage(r).set_unit_tiles(tiles);
  }
  g.zero_grads();
  g.set_loss_scale(kLossScale);
  Result out;
  for (int mb = 0; mb < kMicrobatches; ++mb) forward_microbatch(g, mb, ids(m, mb, false), ids(m, mb, true), out.losses);
  for (int mb = 0; mb < kMicrobatches; ++mb)
    for (int u = U - 1; u >= 0; --u) {
      g.backward_input(u, mb);
      if (tiles == 1 && is_branch(g.stage(), u)) add_branch_terms(g, c, u, mb, out);
      g.backward_weight(u, mb);
      if (tiles > 1 && is_branch(g.stage(), u)) {
        out.records_after_w.emplace_back();
        for (const ActivationRecord& rec : g.stage().activation_records(u, mb))
          out.records_after_w.back().push_back(rec.name.substr(g.stage().unit_name(u).size() + 1));
      }
    }
  for (int r = 0; r < g.tp(); ++r)
    for (ParamInfo& p : g.stage(r).params())
      out.grads[std::to_string(r) + "/" + p.name] = host_copy(p.grad, g.compute(r));
  return out;
}

class UnitTiles : public ::testing::TestWithParam<Case> {};

TEST_P(UnitTiles, LossesBitwiseAndGradientsWithinTheReorderingBound) {
  const Case c = GetParam();
  OneBlasThread one;
  const Result ref = run(c, 1);
  const double n = 2.0 * kBatch * 24, gamma = gamma_n(n);
  // The branch GEMMs' weights and biases sum in another order (their terms are in abs_terms); every
  // other gradient is bitwise.
  auto terms = [&](const std::string& name) -> const std::vector<double>* {
    auto it = ref.abs_terms.find(name);
    return it == ref.abs_terms.end() ? nullptr : &it->second;
  };
  for (int tiles : {2, 4}) {
    SCOPED_TRACE("tiles " + std::to_string(tiles));
    const Result got = run(c, tiles);
    ASSERT_NO_FATAL_FAILURE(expect_losses_bitwise(got.losses, ref.losses));
    ReorderCheck check;
    ASSERT_NO_FATAL_FAILURE(expect_gradients_match(got.grads, ref.grads, gamma, terms, check));
    EXPECT_GE(check.reordered, 2 * model_of(c).n_layer * 2 * c.tp) << "every branch's GEMM weights are checked";
    for (const std::vector<std::string>& names : got.records_after_w) {
      std::vector<std::string> sorted = names;
      std::sort(sorted.begin(), sorted.end());
      const std::vector<std::string> want = c.arch == std::string("gpt2")
                                                ? std::vector<std::string>{"ln.mean", "ln.rstd", "ln.x"}
                                                : std::vector<std::string>{"ln.rstd", "ln.x"};
      EXPECT_EQ(sorted, want) << "a tiled branch keeps only what B(u-1) reads after its W";
    }
    std::printf("[ %s tp %d %s %s tiles %d ] branch weights: worst difference %.3f of the bound 2·γ_n·Σ|x|, n %.0f\n",
                c.arch, c.tp, c.attention == AttentionKernel::Fused ? "fused" : "naive", to_string(c.precision), tiles,
                check.worst, n);
  }
}

INSTANTIATE_TEST_SUITE_P(Branches, UnitTiles,
                         ::testing::Values(Case{"gpt2", 1, AttentionKernel::Naive, DType::F32},
                                           Case{"gpt2", 2, AttentionKernel::Naive, DType::F32},
                                           Case{"gpt2", 1, AttentionKernel::Fused, DType::F32},
                                           Case{"gpt2", 2, AttentionKernel::Naive, DType::Bf16},
                                           Case{"llama", 1, AttentionKernel::Naive, DType::F32},
                                           Case{"llama", 2, AttentionKernel::Fused, DType::F32},
                                           Case{"llama", 2, AttentionKernel::Naive, DType::Bf16}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_tp" + std::to_string(i.param.tp) +
                                  (i.param.attention == AttentionKernel::Fused ? "_fused_" : "_naive_") +
                                  std::string(to_string(i.param.precision));
                         });

// Only Recompute::Full units tile: under None the tiled setting runs B and W as before, bitwise.
TEST(UnitTilesSetting, UnitsWithoutFullRecomputeRunAsBefore) {
  OneBlasThread one;
  const Case c{"gpt2", 1, AttentionKernel::Naive, DType::F32};
  const ModelSpec m = model_of(c);
  std::vector<std::map<std::string, std::vector<float>>> grads;
  for (int tiles : {1, 4}) {
    TpGroup g(m, StageSpec{0, m.n_layer, 0, 1, kBatch}, 1);
    g.stage().init_random(42, g.compute());
    g.stage().set_unit_tiles(tiles);
    g.zero_grads();
    fill_ids(g.stage().tokens(0), ids(m, 0, false));
    fill_ids(g.stage().targets(0), ids(m, 0, true));
    for (int u = 0; u < g.num_units(); ++u) g.forward(u, 0);
    for (int u = g.num_units() - 1; u >= 0; --u) g.backward_input(u, 0), g.backward_weight(u, 0);
    grads.emplace_back();
    for (ParamInfo& p : g.stage().params()) grads.back()[p.name] = host_copy(p.grad, g.compute());
  }
  for (const auto& [name, want] : grads[0])
    EXPECT_EQ(0, std::memcmp(grads[1].at(name).data(), want.data(), 4 * want.size())) << name;
}

TEST(UnitTilesSetting, RejectsTilesThatDoNotDivideTheMicrobatch) {
  const ModelSpec m = model_of(Case{"gpt2", 1, AttentionKernel::Naive, DType::F32});
  TpGroup g(m, StageSpec{0, m.n_layer, 0, 1, kBatch}, 1);
  EXPECT_THROW(g.stage().set_unit_tiles(3), Error);
  EXPECT_THROW(g.stage().set_unit_tiles(0), Error);
  g.stage().set_unit_tiles(2);
  EXPECT_EQ(g.stage().unit_tiles(), 2);
}

}  // namespace
}  // namespace stp::testing
