// The chunked loss head (Stage::set_loss_chunk_tokens) against the unchunked one, for gpt2 (tied
// wte) and llama (untied lm_head, and tied), on 1 and 2 TP ranks with the vocabulary replicated and
// vocab-parallel (a vocabulary that tp does not divide: padding rows), f32 and bf16, with ignored
// targets (-1), over two microbatches in flight at once, at chunk sizes that divide B·T, that do
// not, B·T itself and more than B·T.
//
// The CPU GEMM (OpenBLAS 0.3.21, its Haswell kernels on this machine) computes a row of C by an
// arithmetic that depends on the row's place in the kernel's tiles of M (24 rows) and on how M is
// split over threads: the same row in a GEMM of another row count can differ in its last bits.
// The chunked head's rows are therefore bitwise the unchunked ones when its chunks cut M where the
// unchunked GEMM's tiles do: one BLAS thread (set here) and chunks a multiple of kGemmRowTile (or
// one chunk of all rows). Other chunk sizes are held to the float64 reference at the unchunked
// head's tolerance (tests/models/loss_mask_reference_test.cpp, its loss-chunk cases).
//
// What must hold, and why:
//  * every microbatch's loss, on every rank, bitwise (memcmp): a row's logits, loss terms and lse
//    are the unchunked row's (the loss is the same mean_of_rows over the same per-row losses);
//  * every gradient but the LM head weight's bitwise: the seed, dln = dlogits W and so dx and the
//    final norm's gradients are per row or summed over the same rows;
//  * the head weight's gradient sums the same products dlogits[t,v]·ln[t,c] (and, tied, the
//    embedding's dx rows) in another order: chunk by chunk in F instead of one GEMM in W. Any
//    summation order of n terms x_i in f32 (products fused or rounded once) is within
//    γ_n·Σ|x_i| of the exact sum, γ_n = n·u / (1 - n·u), u = 2^-24; two orders are therefore
//    within 2·γ_n·Σ|x_i| of each other. The test computes Σ|x_i| per element from the unchunked
//    run's own records (dlogits and ln.out after the head's B, the embedding's dx after its B) and
//    checks each element against that bound;
//  * forward-only (evaluation): the same losses bitwise, and no gradient written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tests/models/reorder_test_util.h"

namespace stp::testing {
namespace {

using i64 = std::int64_t;

struct Case {
  const char* arch;
  int tp;
  bool vocab_parallel;
  DType precision;
  bool tied = true;
};

ModelSpec model_of(const Case& c) {
  ModelSpec m = small_model(c.arch, 16, c.precision);
  m.tie_embeddings = c.tied;
  return m;
}

constexpr int kBatch = 4, kMicrobatches = 2;  // B·T = 64 rows
constexpr i64 kGemmRowTile = 24;              // OpenBLAS's SGEMM row tile on Haswell kernels
constexpr float kLossScale = 0.75f;

std::string head_weight(const Case& c) {
  if (std::string(c.arch) == "gpt2") return "wte.weight";
  return c.tied ? "model.embed_tokens.weight" : "lm_head.weight";
}

// Tokens and targets of microbatch mb; about one target in five is -1 (ignored).
std::vector<float> ids(const ModelSpec& m, int mb, bool targets) { return seeded_ids(m, kBatch, mb, targets, 5); }

struct Result {
  std::vector<std::vector<float>> losses;  // [mb][rank]
  std::map<std::string, std::vector<float>> grads;
  std::vector<double> abs_terms;  // Σ|x_i| per element of the head weight (unchunked runs only)
  double terms = 0;               // n: the terms each head-weight element sums
};

// The unchunked run's Σ|dlogits[t,v]·ln[t,c]| over its rows (every rank's columns when
// vocab-parallel, rank 0's when replicated) into abs_terms (V x C).
void add_head_terms(TpGroup& g, const ModelSpec& m, int u, int mb, Result& out) {
  const i64 C = m.n_embd, V = m.vocab_size;
  for (int r = 0; r < g.tp(); ++r) {
    std::vector<float> dl = record_values(g.stage(r), u, mb, "head.dlogits", g.compute(r));
    std::vector<float> ln = record_values(g.stage(r), u, mb, "head.ln.out", g.compute(r));
    const i64 N = static_cast<i64>(ln.size()) / C, Vs = static_cast<i64>(dl.size()) / N;
    const i64 v0 = Vs == V ? 0 : r * Vs;
    for (i64 t = 0; t < N; ++t)
      for (i64 j = 0; j < Vs && v0 + j < V; ++j)
        for (i64 c = 0; c < C; ++c)
          out.abs_terms[static_cast<std::size_t>((v0 + j) * C + c)] +=
              std::fabs(static_cast<double>(dl[static_cast<std::size_t>(t * Vs + j)])) *
              std::fabs(static_cast<double>(ln[static_cast<std::size_t>(t * C + c)]));
    if (Vs == V) break;  // replicated: every rank holds the same products
  }
  out.terms += static_cast<double>(kBatch) * m.seq_len;
}

// Tied: the embedding's W adds the dx rows of each token into the same gradient.
void add_embed_terms(TpGroup& g, const ModelSpec& m, int mb, Result& out) {
  const i64 C = m.n_embd;
  std::vector<float> dx = record_values(g.stage(0), 0, mb, "embed.dx", g.compute(0));
  std::vector<float> tok = ids(m, mb, false);
  for (std::size_t t = 0; t < tok.size(); ++t)
    for (i64 c = 0; c < C; ++c)
      out.abs_terms[static_cast<std::size_t>(static_cast<i64>(tok[t]) * C + c)] +=
          std::fabs(static_cast<double>(dx[t * static_cast<std::size_t>(C) + static_cast<std::size_t>(c)]));
  out.terms += static_cast<double>(tok.size());
}

// Two microbatches: F of both, then B and W of each (the head's W deferred past the other's F).
Result run(const Case& c, i64 chunk, bool forward_only = false) {
  const ModelSpec m = model_of(c);
  StageSpec spec{0, m.n_layer, 0, c.tp, kBatch};
  spec.vocab_parallel = c.vocab_parallel;
  TpGroup g(m, spec, c.tp);
  for (int r = 0; r < g.tp(); ++r) {
    g.stage(r).init_random(42, g.compute(r));
    g.stage(r).set_loss_chunk_tokens(chunk);
    g.stage(r).set_forward_only(forward_only);
  }
  g.zero_grads();
  g.set_loss_scale(kLossScale);
  const int U = g.num_units(), head = U - 1;
  Result out;
  const bool tied_head = std::string(c.arch) == "gpt2" || c.tied;
  out.abs_terms.assign(static_cast<std::size_t>(m.vocab_size) * m.n_embd, 0.0);
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    forward_microbatch(g, mb, ids(m, mb, false), ids(m, mb, true), out.losses);
    if (chunk > 0 && !forward_only) {
      std::vector<ActivationRecord> rec = g.stage(0).activation_records(head, mb);
      EXPECT_EQ(rec.size(), 1u) << "the chunked head keeps dx alone";
      if (!rec.empty()) {
        EXPECT_EQ(rec[0].name, "head.dx");
      }
    }
  }
  if (forward_only) {
    for (int r = 0; r < g.tp(); ++r)
      for (int mb = 0; mb < kMicrobatches; ++mb) g.stage(r).release_microbatch(mb, g.compute(r));
  } else {
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      for (int u = U - 1; u >= 0; --u) {
        g.backward_input(u, mb);
        if (chunk == 0 && u == head) add_head_terms(g, m, u, mb, out);
        if (chunk == 0 && u == 0 && tied_head) add_embed_terms(g, m, mb, out);
        g.backward_weight(u, mb);
      }
    }
  }
  for (ParamInfo& p : g.stage(0).params()) out.grads[p.name] = g.full_grad(p.name);
  return out;
}

class LossChunk : public ::testing::TestWithParam<Case> {};

TEST_P(LossChunk, LossesAndGradientsMatchTheUnchunkedHead) {
  const Case c = GetParam();
  OneBlasThread one;
  const Result ref = run(c, 0);
  const std::string hw = head_weight(c);
  const double n = ref.terms, gamma = gamma_n(n);
  ASSERT_GT(n, 0);
  // The head weight's gradient sums in another order; every other gradient is bitwise.
  auto terms = [&](const std::string& name) { return name == hw ? &ref.abs_terms : nullptr; };
  // B·T = 64: 24 and 48 do not divide it (a last chunk of 16), 64 is one chunk, 200 more than B·T.
  for (i64 chunk : {kGemmRowTile, 2 * kGemmRowTile, i64{64}, i64{200}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Result got = run(c, chunk);
    ASSERT_NO_FATAL_FAILURE(expect_losses_bitwise(got.losses, ref.losses));
    ReorderCheck check;
    ASSERT_NO_FATAL_FAILURE(expect_gradients_match(got.grads, ref.grads, gamma, terms, check));
    std::printf("[ %s tp %d%s %s chunk %lld ] head weight: worst difference %.3f of the bound 2·γ_n·Σ|x|, n %.0f\n",
                c.arch, c.tp, c.vocab_parallel ? " vocab" : "", to_string(c.precision), static_cast<long long>(chunk),
                check.worst, n);
  }
}

TEST_P(LossChunk, ForwardOnlyLossesAreBitwiseAndWriteNoGradient) {
  const Case c = GetParam();
  OneBlasThread one;
  const Result ref = run(c, 0, /*forward_only=*/true);
  for (i64 chunk : {kGemmRowTile, i64{64}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Result got = run(c, chunk, /*forward_only=*/true);
    ASSERT_NO_FATAL_FAILURE(expect_losses_bitwise(got.losses, ref.losses));
    for (const auto& [name, g] : got.grads)
      for (float x : g) ASSERT_EQ(x, 0.0f) << name << ": forward-only wrote a gradient";
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, LossChunk,
                         ::testing::Values(Case{"gpt2", 1, false, DType::F32}, Case{"gpt2", 2, false, DType::F32},
                                           Case{"gpt2", 2, true, DType::F32}, Case{"gpt2", 2, true, DType::Bf16},
                                           Case{"llama", 1, false, DType::F32, false},
                                           Case{"llama", 2, false, DType::F32, false},
                                           Case{"llama", 2, true, DType::F32, false},
                                           Case{"llama", 2, true, DType::Bf16, false},
                                           Case{"llama", 1, false, DType::Bf16, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_tp" + std::to_string(i.param.tp) +
                                  (i.param.vocab_parallel ? "_vocab" : "") + "_" +
                                  std::string(to_string(i.param.precision)) + (i.param.tied ? "_tied" : "_untied");
                         });

TEST(LossChunkSetting, RejectsNegativeTokens) {
  Case c{"gpt2", 1, false, DType::F32};
  const ModelSpec m = model_of(c);
  TpGroup g(m, StageSpec{0, m.n_layer, 0, 1, kBatch}, 1);
  EXPECT_THROW(g.stage().set_loss_chunk_tokens(-1), Error);
  g.stage().set_loss_chunk_tokens(7);
  EXPECT_EQ(g.stage().loss_chunk_tokens(), 7);
}

}  // namespace
}  // namespace stp::testing
