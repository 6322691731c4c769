// Kernel parity: every kernel of core/kernels/ (nn_kernels.h, llama_kernels.h, optim_kernels.h,
// gemm_kernels.h) and Stream::gemm run on a CpuDevice, the oracle, and on the device under test with
// the same inputs; the device's outputs must match the oracle's within a tolerance stated, and
// derived, next to each test. Kernels templated on the storage type run for f32 (NAME) and bf16
// (NAMEBf16).
// The fixture is tests/support/kernel_parity.h; Stream::gemm's and the linear layers' cases are in
// kernel_parity_gemm_test.cpp, the fused attention's (attention_kernels.h) in
// kernel_parity_attention_test.cpp and the Llama kernels' in kernel_parity_llama_test.cpp.
//
// Instances (Backends/KernelParity.NAME/KIND):
//   * cpu  — the device under test is a second CpuDevice. The CPU kernels are deterministic (fixed
//            reduction order, nn_kernels.h) and OpenBLAS splits GEMMs over M and N only, so every
//            output must be bitwise equal: this runs every test body and the comparison here.
//   * cuda — a CudaDevice: each output within its CUDA tolerance. Skipped (with cuda_usable's
//            reason, which tools/gpu-check reads) where no GPU is usable.
//
// Where the two backends can differ, for f32 arithmetic (u = 2^-24, the unit roundoff):
//   * nvcc contracts a * b + c into one FMA (--fmad=true, its default); the host build has no FMA
//     (no -march), so each contracted product is rounded once less on the GPU: the same fixed-order
//     sum then differs by up to about one rounding per term.
//   * expf: CUDA's has at most 2 ulp of error (CUDA C++ Programming Guide, single-precision
//     mathematical functions), glibc's under 1 ulp: up to 3 ulp apart. logf: 1 ulp each.
//   * Division and sqrtf are IEEE round-to-nearest on both (nvcc's -prec-div/-prec-sqrt default to
//     true; stp does not use --use_fast_math), and so are + and * and float <-> double conversion.
//     Kernels made only of those, evaluated in the same order with no product to contract, are
//     therefore bitwise equal on CUDA too: that is asserted (tolerance "exact").
//   * cuBLAS sums GEMM products in its own order (blocking, split-K). For any order, with or without
//     FMA, a K-term f32 dot product is within gamma_K * sum|a_p * b_p| of the exact value, gamma_K =
//     K u / (1 - K u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1); two
//     such results are within twice that. No TF32: stp asks for CUBLAS_COMPUTE_32F.
//   * bf16 storage (core/dtype.h): kernels widen exactly, compute in f32 and round once on store
//     (to nearest even, the same function on both). Two f32 results within an f32 tolerance round
//     to bf16 values at most one bf16 ulp (<= 2^-7 of the value) further apart: stored_as<bf16>
//     adds that; identical f32 results round identically, so "exact" stays exact.
// Bounds below are those worst cases (a few rounded up). Typical errors are far smaller; a wrong
// kernel (an index, a missed element, a race) is off by O(1). Every comparison on a non-CPU device
// prints its largest errors next to the tolerance, so the first GPU run shows the margins.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/nn_kernels.h"
#include "core/kernels/optim_kernels.h"
#include "core/kernels/vocab_kernels.h"
#include "tests/support/kernel_parity.h"

// In stp::testing (not an anonymous namespace): the cases are members of the shared fixture.
namespace stp::testing {

using i64 = std::int64_t;

// ---- LayerNorm -------------------------------------------------------------------------------------

// f32 input and statistics, output stored as T.
template <typename T>
void KernelParity::layernorm_forward_case() {
  auto x = uniform(kRows * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), b = uniform(kC, -0.5f, 0.5f);
  auto dx = upload(x), dw = upload(w), db = upload(b);
  auto out = upload(values<T>(kRows * kC, -9, 9));
  auto mean = upload(uniform(kRows, -9, 9)), rstd = upload(uniform(kRows, -9, 9));
  run([&](Stream& s, Side at) {
    stp::layernorm_forward(s, at(out), at(mean), at(rstd), at(dx), at(dw), at(db), kRows, kC);
  });
  // mean: C adds in index order and one division: exact.
  expect_match("mean", mean, Tolerance::exact());
  // rstd: the variance sums C squares, each (x-m)*(x-m) + v contracted on CUDA: a positive sum whose
  // roundings may all differ, so relatively C u apart; the square root halves it; + eps, sqrtf and
  // 1 / . may each flip a rounding: (C/2 + 3) u, doubled and rounded up.
  expect_match("rstd", rstd, within((kC + 8) * kU));
  // out = xhat * w + b (contracted on CUDA): xhat carries rstd's (C/2 + 3) u and 2 u of its own,
  // relative to |xhat * w| <= max|out| + max|b|; (C + 16) u of the largest output covers that twice.
  expect_match("out", out, stored_as<T>(within(2 * kU, 0, (kC + 16) * kU)));
}

TEST_P(KernelParity, LayerNormForward) { layernorm_forward_case<float>(); }
TEST_P(KernelParity, LayerNormForwardBf16) { layernorm_forward_case<bf16>(); }
TEST_P(KernelParity, LayerNormBackwardInput) {
  auto x = uniform(kRows * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), dout = uniform(kRows * kC, -1, 1);
  // mean and rstd as the forward saves them (from the oracle), the same on both sides.
  std::vector<float> m(kRows), r(kRows);
  for (i64 n = 0; n < kRows; ++n) {
    double s = 0, s2 = 0;
    for (i64 c = 0; c < kC; ++c) s += x[static_cast<std::size_t>(n * kC + c)];
    for (i64 c = 0; c < kC; ++c) s2 += std::pow(x[static_cast<std::size_t>(n * kC + c)] - s / kC, 2);
    m[static_cast<std::size_t>(n)] = static_cast<float>(s / kC);
    r[static_cast<std::size_t>(n)] = static_cast<float>(1 / std::sqrt(s2 / kC + 1e-5));
  }
  auto dx_ = upload(x), dw = upload(w), dd = upload(dout), dm = upload(m), dr = upload(r);
  auto resid = upload(uniform(kRows * kC, -1, 1));
  auto out = upload(uniform(kRows * kC, -9, 9)), out_resid = upload(uniform(kRows * kC, -9, 9));
  auto in_place = upload(uniform(kRows * kC, -1, 1));  // resid aliasing dx (the residual stream's gradient)
  run([&](Stream& s, Side at) {
    stp::layernorm_backward_input(s, at(out), nullptr, at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
    stp::layernorm_backward_input(s, at(out_resid), at(resid), at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
    stp::layernorm_backward_input(s, at(in_place), at(in_place), at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
  });
  // dx = resid + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w. Both row means are
  // C-term sums of products (2 roundings each, contracted on CUDA): each evaluation within
  // gamma_{C+2} sum|terms| of the exact sum, so the means are 2 gamma_{C+2} sum|terms| / C apart;
  // they enter dx times rstd and times rstd |xhat|. The elementwise part (4 operations, the
  // residual add) adds 8 u of its terms. Per element, doubled.
  std::vector<double> bound(kRows * kC);
  const double gamma = (kC + 2) * kU / (1 - (kC + 2) * kU);
  for (i64 n = 0; n < kRows; ++n) {
    const double rs = r[static_cast<std::size_t>(n)];
    double sg = 0, sgx = 0, g_mean = 0, gx_mean = 0;
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = (x[i] - m[static_cast<std::size_t>(n)]) * rs;
      sg += std::fabs(g), sgx += std::fabs(g * xh), g_mean += g / kC, gx_mean += g * xh / kC;
    }
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = (x[i] - m[static_cast<std::size_t>(n)]) * rs;
      double means = rs * 2 * gamma * (sg + std::fabs(xh) * sgx) / kC;
      double elementwise =
          8 * kU * (rs * (std::fabs(g) + std::fabs(g_mean) + std::fabs(xh * gx_mean)) + 2.0);  // |resid| <= 1
      bound[i] = 2 * (means + elementwise);
    }
  }
  const Tolerance tol = per_element(bound);
  expect_match("dx", out, tol);
  expect_match("dx + resid", out_resid, tol);
  expect_match("dx += (in place)", in_place, tol);
}

// Per-channel sums over rows: sum_n dout * xhat (contracted on CUDA) and sum_n dout (adds only).
TEST_P(KernelParity, LayerNormBackwardWeight) {
  auto x = uniform(kRows * kC, -2, 3), dout = uniform(kRows * kC, -1, 1);
  auto m = uniform(kRows, 0.4f, 0.6f), r = uniform(kRows, 0.6f, 0.8f);
  auto dwi = uniform(kC, -1, 1), dbi = uniform(kC, -1, 1);  // accumulates onto what is there
  auto dx_ = upload(x), dd = upload(dout), dm = upload(m), dr = upload(r), dw = upload(dwi), db = upload(dbi);
  run([&](Stream& s, Side at) {
    stp::layernorm_backward_weight_accumulate(s, at(dw), at(db), at(dd), at(dx_), at(dm), at(dr), kRows, kC);
  });
  // dw: an N-term dot product (+ the initial value) evaluated with and without FMA: the GEMM bound
  // 2 gamma_{N+2} (sum_n |dout * xhat| + |dw0|), xhat itself 2 u apart at most (the same two
  // roundings on both sides unless contracted): 4 u more of the sum.
  std::vector<double> bound(kC);
  const double gamma = (kRows + 4) * kU;
  for (i64 c = 0; c < kC; ++c) {
    double s = 0;
    for (i64 n = 0; n < kRows; ++n) {
      auto i = static_cast<std::size_t>(n * kC + c);
      s += std::fabs(double(dout[i]) * (x[i] - m[static_cast<std::size_t>(n)]) * r[static_cast<std::size_t>(n)]);
    }
    bound[static_cast<std::size_t>(c)] = 2 * gamma * (s + std::fabs(dwi[static_cast<std::size_t>(c)]));
  }
  expect_match("dw", dw, per_element(bound));
  // db: N adds in row order, then one add: exact.
  expect_match("db", db, Tolerance::exact());
}

// ---- GELU, add, convert ------------------------------------------------------------------------------

constexpr i64 kElems = 100003;  // several CUDA blocks, a partial last one

// gelu(x) = x * s, s = sigmoid(2u), u = c (x + 0.044715 x^3), the sigmoid 1 / (1 + e) or e / (1 + e)
// with e = exp_nonpositive(-2|u|) (activation_rows.h, the same polynomial on both sides). u is 3 u
// (unit roundoff) apart at most (the cubic term's product may be contracted; same sign, no
// cancellation), so e is (6 |u| + 3) u apart (3 ulp where one side fuses a multiply-add of the
// polynomial); s and x * s add 4 roundings. |x| <= 4 here gives |u| <= 5.5: 40 u, rounded up to
// 64 u, relative (no cancellation anywhere).
constexpr double kGeluRel = 64 * kU;

template <typename T>
void KernelParity::gelu_forward_case() {
  auto x = upload(values<T>(kElems, -4, 4)), y = upload(values<T>(kElems, -9, 9));
  run([&](Stream& s, Side at) { stp::gelu_forward(s, at(y), at(x), kElems); });
  expect_match("y", y, stored_as<T>(within(kGeluRel)));
}

TEST_P(KernelParity, GeluForward) { gelu_forward_case<float>(); }
TEST_P(KernelParity, GeluForwardBf16) { gelu_forward_case<bf16>(); }

// dx = dy * (s + x u' 2 s (1 - s)): s is 3 u apart where it matters (the error of exp(-2u)
// enters s scaled by s (1 - s)), the second term <= ~1.1 in size; the sum cancels near x = -0.75, so
// the bound is absolute in |dy| (<= 1 here): 64 u, with the relative 64 u for the rest.
template <typename T>
void KernelParity::gelu_backward_case() {
  auto x = upload(values<T>(kElems, -4, 4)), dy = upload(values<T>(kElems, -1, 1)),
       dx = upload(values<T>(kElems, -9, 9));
  auto in_place = upload(values<T>(kElems, -1, 1));  // dx aliasing dy
  run([&](Stream& s, Side at) {
    stp::gelu_backward(s, at(dx), at(dy), at(x), kElems);
    stp::gelu_backward(s, at(in_place), at(in_place), at(x), kElems);
  });
  const Tolerance tol = stored_as<T>(within(kGeluRel, 64 * kU));
  expect_match("dx", dx, tol);
  expect_match("dx (in place)", in_place, tol);
}

TEST_P(KernelParity, GeluBackward) { gelu_backward_case<float>(); }
TEST_P(KernelParity, GeluBackwardBf16) { gelu_backward_case<bf16>(); }

// One IEEE add per element: exact.
TEST_P(KernelParity, Add) {
  auto a = upload(uniform(kElems, -1, 1)), b = upload(uniform(kElems, -1e3f, 1e3f)), y = upload(uniform(kElems, -9, 9));
  auto in_place = upload(uniform(kElems, -1, 1));
  run([&](Stream& s, Side at) {
    stp::add(s, at(y), at(a), at(b), kElems);
    stp::add(s, at(in_place), at(in_place), at(b), kElems);
  });
  expect_match("y", y, Tolerance::exact());
  expect_match("y (in place)", in_place, Tolerance::exact());
}

// f32 -> bf16 (integer rounding to nearest even, NaN quietened) and bf16 -> f32 (a shift): the same
// integer operations on both: exact. bf16 -> f32 over every one of the 65536 bf16 values; f32 ->
// bf16 over random values of every magnitude plus ties, infinities, NaN, overflow and subnormals.
TEST_P(KernelParity, Convert) {
  std::vector<bf16> every(65536);
  for (std::size_t i = 0; i < every.size(); ++i) every[i].bits = static_cast<std::uint16_t>(i);
  std::vector<float> f32s;
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 20000; ++i) f32s.push_back(stp::bits_float(bits(rng_)));
  for (std::uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                          0x7f800001u, 0x7f7fffffu, 0x00000001u, 0x80000000u, 0x007fffffu})
    f32s.push_back(stp::bits_float(u));
  auto src_b = upload(every);
  auto src_f = upload(f32s);
  auto to_f = upload(std::vector<float>(every.size(), -1));
  auto to_b = upload(std::vector<bf16>(f32s.size(), bf16{1}));
  run([&](Stream& s, Side at) {
    stp::convert(s, at(to_f), at(src_b), static_cast<i64>(every.size()));
    stp::convert(s, at(to_b), at(src_f), static_cast<i64>(f32s.size()));
  });
  expect_match("bf16 -> f32", to_f, Tolerance::exact());
  expect_match("f32 -> bf16", to_b, Tolerance::exact());
}

// ---- Embedding -------------------------------------------------------------------------------------

constexpr i64 kB = 3, kT = 16, kEmb = 24, kV = 50;

// out = wte[token] + wpe[t]: one add per element: exact.
TEST_P(KernelParity, EmbeddingForward) {
  auto tok = upload(tokens(kB * kT, kV));
  auto wte = upload(uniform(kV * kEmb, -1, 1)), wpe = upload(uniform((kT + 4) * kEmb, -1, 1));
  auto out = upload(uniform(kB * kT * kEmb, -9, 9));
  run([&](Stream& s, Side at) { stp::embedding_forward(s, at(out), at(tok), at(wte), at(wpe), kB, kT, kEmb); });
  expect_match("out", out, Tolerance::exact());
}

// dwte[v] += the rows of token v summed in row order (a stable counting sort, integers), dwpe[t] +=
// sum over the batch: adds only, in a fixed order: exact. Tokens are drawn below 37 of 50 so some
// entries get no rows (and must keep their value), and many get several.
TEST_P(KernelParity, EmbeddingBackward) {
  auto tok = upload(tokens(kB * kT, 37));
  auto dout = upload(uniform(kB * kT * kEmb, -1, 1));
  auto dwte = upload(uniform(kV * kEmb, -1, 1)), dwpe = upload(uniform((kT + 4) * kEmb, -1, 1));
  auto ws =
      upload(std::vector<std::int32_t>(static_cast<std::size_t>(stp::embedding_backward_workspace(kV, kB * kT)), -1));
  run([&](Stream& s, Side at) {
    stp::embedding_backward_accumulate(s, at(dwte), at(dwpe), at(dout), at(tok), at(ws), kB, kT, kEmb, kV);
  });
  expect_match("dwte", dwte, Tolerance::exact());
  expect_match("dwpe", dwpe, Tolerance::exact());
}

// ---- Attention -------------------------------------------------------------------------------------

constexpr i64 kAB = 2, kAT = 16, kNH = 3, kD = 8, kW = kNH * kD;

// bf16 attention rounds its intermediates (scores and probabilities in att, datt, dscores) to bf16
// between the GEMMs, so where an f32 intermediate within the f32 bounds below lies near a bf16
// rounding boundary the two sides round it to neighbouring values (2^-7 of a score apart), and the
// later GEMMs carry that on. Against f32 attention, where every intermediate is rounded, bf16
// attention stays within 2e-2 of the largest output (tests/core/bf16_test.cpp, measured 3e-3 ..
// 4e-3); two bf16 evaluations that differ in at most every rounding by one ulp are within twice the
// rounding error: 2e-2 of the largest output for y, att and dqkv.
constexpr double kBf16AttentionOfMax = 2e-2;

// f32: scores q.k / sqrt(D): GEMMs with K = D, within 2 gamma_{D+2} sum|q k| / sqrt(D) <= 2 (D+2) u
// sqrt(D) (|q|, |k| <= 1) = 57 u apart. Softmax turns score errors d into a relative error <= 2 d
// in att, plus the subtraction of the row max (|s - max| <= 2 sqrt(D): 6 u), 3 ulp of expf and up
// to T flipped roundings of the row sum (same order): (114 + 6 + 3 + 16 + 2) u = 141 u -> 256 u
// relative. y = att v (K = T): att's relative error times sum att |v| <= 1, plus 2 gamma_{T+2}
// sum att |v| <= 36 u: 177 u -> 512 u absolute (|v| <= 1, so |y| <= 1).
template <typename T>
void KernelParity::attention_forward_case() {
  auto qkv = upload(values<T>(kAB * kAT * 3 * kW, -1, 1));
  auto y = upload(values<T>(kAB * kAT * kW, -9, 9)), att = upload(values<T>(kAB * kNH * kAT * kAT, -9, 9));
  run([&](Stream& s, Side at) { stp::attention_forward(s, at(y), at(att), at(qkv), kAB, kAT, kNH, kD); });
  const bool f32 = std::is_same_v<T, float>;
  expect_match("att", att, f32 ? within(256 * kU) : within(0, 0, kBf16AttentionOfMax));
  expect_match("y", y, f32 ? within(0, 512 * kU) : within(0, 0, kBf16AttentionOfMax));
}

TEST_P(KernelParity, AttentionForward) { attention_forward_case<float>(); }
TEST_P(KernelParity, AttentionForwardBf16) { attention_forward_case<bf16>(); }

// Backward, with the same att on both sides (the oracle's forward), |q|, |k|, |v|, |dy| <= 1:
//   datt = dy v^T (K = D): within 2 gamma_{D+2} sum|dy v| <= 160 u.
//   dv = att^T dy (K = T): 2 gamma_{T+2} sum_t att_tj |dy_t| <= 36 u * (column sum of att <= T) = 576 u.
//   dscores = att (datt - sum_j att datt) / sqrt(D): datt's 160 u, the dot's 160 u + T u max|datt|
//     (<= D) = 128 u: att_ij * 448 u / sqrt(8) <= att_ij * 160 u.
//   dq = dscores k (K = T, over a row of att, which sums to 1): 160 u + 2 gamma_{T+2} sum|ds k|
//     (|ds| <= att * 2 D / sqrt(D)) <= 160 u + 36 u * 5.7 = 365 u.
//   dk = dscores^T q (K = T, over a column of att, which sums to <= T): 16 * 365 u = 5840 u.
// 8192 u (4.9e-4) absolute bounds every part of dqkv (f32). These are worst cases; a wrong index or
// a missed head is off by O(0.1 .. 1). bf16: kBf16AttentionOfMax.
template <typename T>
void KernelParity::attention_backward_case() {
  auto qkv = upload(values<T>(kAB * kAT * 3 * kW, -1, 1));
  auto y = upload(std::vector<T>(kAB * kAT * kW)), att_fwd = upload(std::vector<T>(kAB * kNH * kAT * kAT));
  stp::attention_forward(*stream_[0], y.on[0], att_fwd.on[0], qkv.on[0], kAB, kAT, kNH, kD);
  auto att = upload(download(att_fwd, 0));  // the oracle's att, on both sides
  auto dy = upload(values<T>(kAB * kAT * kW, -1, 1));
  auto dqkv = upload(values<T>(kAB * kAT * 3 * kW, -9, 9)), datt = upload(values<T>(kAB * kNH * kAT * kAT, -9, 9));
  run([&](Stream& s, Side at) {
    stp::attention_backward(s, at(dqkv), at(datt), at(dy), at(qkv), at(att), kAB, kAT, kNH, kD);
  });
  expect_match("dqkv", dqkv, std::is_same_v<T, float> ? within(0, 8192 * kU) : within(0, 0, kBf16AttentionOfMax));
}

TEST_P(KernelParity, AttentionBackward) { attention_backward_case<float>(); }
TEST_P(KernelParity, AttentionBackwardBf16) { attention_backward_case<bf16>(); }

// ---- Cross-entropy --------------------------------------------------------------------------------

constexpr i64 kCeN = 40, kCeV = 257;

// Logits stored as T (widened exactly), results f32. lse = max + logf(sum_v exp(l - max)), the
// exponential exp_nonpositive on both sides: the same polynomial, whose multiply-adds one side may
// fuse and the other not (3 ulp apart at most: SoftmaxRows.VectorFormsMatchThePlainOnes). V positive terms added in the
// same lane order (core/kernels/softmax_rows.h), so the sums are within (V + 3) u relative (a rounding of each partial
// sum may flip); logf turns that into an absolute (V + 3) u + 2 ulp of |lse|. losses = lse - l[target] (same target
// logit) adds one rounding: (V + 8) u (1 + max|lse|) absolute for both. loss = mean of losses (N adds in order, one
// division): their error + (N + 2) u of the largest loss.
template <typename T>
void KernelParity::cross_entropy_forward_case() {
  auto dl = upload(values<T>(kCeN * kCeV, -3, 3));
  auto tg = upload(tokens(kCeN, kCeV));
  auto loss = upload(std::vector<float>{-9}), losses = upload(uniform(kCeN, -9, 9)), lse = upload(uniform(kCeN, -9, 9));
  run([&](Stream& s, Side at) {
    stp::cross_entropy_forward(s, at(loss), at(losses), at(lse), at(dl), at(tg), kCeN, kCeV);
  });
  std::vector<float> want_lse = download(lse, 0), want_losses = download(losses, 0);
  double max_lse = 0, max_loss = 0;
  for (float v : want_lse) max_lse = std::max(max_lse, double(std::fabs(v)));
  for (float v : want_losses) max_loss = std::max(max_loss, double(std::fabs(v)));
  const double rows = (kCeV + 8) * kU * (1 + max_lse);
  expect_match("lse", lse, within(0, rows));
  expect_match("losses", losses, within(0, rows));
  expect_match("loss", loss, within(0, rows + (kCeN + 2) * kU * max_loss));
}

TEST_P(KernelParity, CrossEntropyForward) { cross_entropy_forward_case<float>(); }
TEST_P(KernelParity, CrossEntropyForwardBf16) { cross_entropy_forward_case<bf16>(); }

// dlogits = exp(l - lse) * scale (lse: the oracle's, on both sides), minus scale at the target,
// stored as T: 3 ulp of the exponential (as above) + 1 rounding relative, and at the target an absolute 4 u * scale (p
// - 1 may cancel); 8 u of each, doubled.
template <typename T>
void KernelParity::cross_entropy_backward_case() {
  auto logits = values<T>(kCeN * kCeV, -3, 3);
  auto dl0 = upload(logits);
  auto tg = upload(tokens(kCeN, kCeV));
  auto loss = upload(std::vector<float>{0}), losses = upload(std::vector<float>(kCeN)),
       lse_fwd = upload(std::vector<float>(kCeN));
  stp::cross_entropy_forward(*stream_[0], loss.on[0], losses.on[0], lse_fwd.on[0], dl0.on[0], tg.on[0], kCeN, kCeV);
  auto lse = upload(download(lse_fwd, 0));
  auto dl = upload(logits);
  const float scale = 1.0f / kCeN;
  run([&](Stream& s, Side at) { stp::cross_entropy_backward_inplace(s, at(dl), at(lse), at(tg), scale, kCeN, kCeV); });
  expect_match("dlogits", dl, stored_as<T>(within(8 * kU, 8 * kU * scale)));
  // The vocab-parallel form on a shard [v0, v0 + Vl) padded to Vs columns: the same entries, the
  // padding (nonzero before) zeroed, the target corrected only on the rank that holds it.
  const i64 v0 = 5, Vl = kCeV, Vs = kCeV + 3;
  std::vector<T> shard(static_cast<std::size_t>(kCeN * Vs), stp::from_f32<T>(0.5f));
  for (i64 n = 0; n < kCeN; ++n) std::copy_n(logits.begin() + n * kCeV, kCeV, shard.begin() + n * Vs);
  auto ds = upload(shard);
  run([&](Stream& s, Side at) { stp::vocab_ce_backward_inplace(s, at(ds), at(lse), at(tg), scale, kCeN, Vs, Vl, v0); });
  expect_match("dlogits (vocab shard)", ds, stored_as<T>(within(8 * kU, 8 * kU * scale)));
}

TEST_P(KernelParity, CrossEntropyBackward) { cross_entropy_backward_case<float>(); }
TEST_P(KernelParity, CrossEntropyBackwardBf16) { cross_entropy_backward_case<bf16>(); }

// Targets of -1 (ignored: data/data.h) on every side: the row's loss is 0 and the others' are
// exactly those of the same rows without the -1s; the loss is their sum in row order over all N
// rows; the ignored rows' dlogits are 0 (replicated and on a vocab shard) and the others' are
// exactly as without the -1s. Each side against itself, then the sides against each other.
TEST_P(KernelParity, CrossEntropySkipsIgnoredTargets) {
  const i64 v0 = 5, Vl = kCeV, Vs = kCeV + 3;
  auto logits = values<float>(kCeN * kCeV, -3, 3);
  std::vector<float> shard(static_cast<std::size_t>(kCeN * Vs), 0.5f);
  for (i64 n = 0; n < kCeN; ++n) std::copy_n(logits.begin() + n * kCeV, kCeV, shard.begin() + n * Vs);
  const std::vector<std::int32_t> all = tokens(kCeN, kCeV);
  std::vector<std::int32_t> some = all;
  for (i64 n = 0; n < kCeN; n += 3) some[static_cast<std::size_t>(n)] = -1;
  auto tg_all = upload(all), tg = upload(some);
  auto dl = upload(logits), loss = upload(std::vector<float>(2)), losses = upload(std::vector<float>(2 * kCeN)),
       lse = upload(std::vector<float>(2 * kCeN));
  run([&](Stream& s, Side at) {
    stp::cross_entropy_forward(s, at(loss), at(losses), at(lse), at(dl), at(tg_all), kCeN, kCeV);
    stp::cross_entropy_forward(s, at(loss) + 1, at(losses) + kCeN, at(lse) + kCeN, at(dl), at(tg), kCeN, kCeV);
  });
  auto d_all = upload(logits), d_some = upload(logits), ds_all = upload(shard), ds_some = upload(shard);
  const float scale = 1.0f / kCeN;
  run([&](Stream& s, Side at) {
    stp::cross_entropy_backward_inplace(s, at(d_all), at(lse), at(tg_all), scale, kCeN, kCeV);
    stp::cross_entropy_backward_inplace(s, at(d_some), at(lse), at(tg), scale, kCeN, kCeV);
    stp::vocab_ce_backward_inplace(s, at(ds_all), at(lse), at(tg_all), scale, kCeN, Vs, Vl, v0);
    stp::vocab_ce_backward_inplace(s, at(ds_some), at(lse), at(tg), scale, kCeN, Vs, Vl, v0);
  });
  for (int side = 0; side < 2; ++side) {
    SCOPED_TRACE(side == 0 ? "oracle" : "device under test");
    const std::vector<float> ls = download(losses, side), l = download(loss, side), z = download(lse, side);
    const std::vector<float> a = download(d_all, side), b = download(d_some, side);
    const std::vector<float> sa = download(ds_all, side), sb = download(ds_some, side);
    float acc = 0.0f;
    for (i64 n = 0; n < kCeN; ++n) {
      const bool ignored = some[static_cast<std::size_t>(n)] < 0;
      const std::size_t i = static_cast<std::size_t>(n);
      EXPECT_EQ(z[kCeN + i], z[i]) << "row " << n;
      EXPECT_EQ(ls[kCeN + i], ignored ? 0.0f : ls[i]) << "row " << n;
      if (!ignored) acc += ls[i];
      for (i64 v = 0; v < kCeV; ++v) {
        const std::size_t k = static_cast<std::size_t>(n * kCeV + v);
        ASSERT_EQ(b[k], ignored ? 0.0f : a[k]) << "row " << n << " column " << v;
      }
      for (i64 v = 0; v < Vs; ++v) {
        const std::size_t k = static_cast<std::size_t>(n * Vs + v);
        ASSERT_EQ(sb[k], ignored ? 0.0f : sa[k]) << "shard row " << n << " column " << v;
      }
    }
    EXPECT_EQ(l[1], acc / static_cast<float>(kCeN));
  }
  expect_match("losses", losses, within(0, (kCeV + 8) * kU * 10));
  expect_match("dlogits", d_some, within(8 * kU, 8 * kU * scale));
  expect_match("dlogits (vocab shard)", ds_some, within(8 * kU, 8 * kU * scale));
}

// ---- Optimizer ---------------------------------------------------------------------------------------

// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p = p (1 - lr wd) - step_size m / (sqrt(v) / c2 +
// eps): each line has one product CUDA may contract (one rounding less) and m may cancel, so m and
// v are within 2 u of their terms (<= max|m|, max|g|); the update's quotient carries m's error
// over denom (v >= 0.01 here, so denom >= 0.1 c2^-1) and 3 roundings; p adds 2 roundings. 8 u
// relative plus 8 u of the largest value, for all three.
TEST_P(KernelParity, AdamWStep) {
  const std::size_t n = 5000;
  stp::AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  auto p = upload(uniform(n, -1, 1)), g = upload(uniform(n, -1, 1)), m = upload(uniform(n, -0.3f, 0.3f)),
       v = upload(uniform(n, 0.01f, 1));
  auto q = upload(uniform(n, -1, 1)), mq = upload(uniform(n, -0.3f, 0.3f)), vq = upload(uniform(n, 0.01f, 1));
  run([&](Stream& s, Side at) {
    for (int step = 1; step <= 3; ++step)
      stp::adamw_step(s, at(p), at(g), at(m), at(v), n, 0.05f, h, step, /*decay=*/true);
    stp::adamw_step(s, at(q), at(g), at(mq), at(vq), n, 0.05f, h, 7, /*decay=*/false);
  });
  // Three chained steps: the differences of one step enter the next unamplified (m, v are
  // averages), so the per-step bound times 3.
  const Tolerance three = within(24 * kU, 0, 24 * kU);
  const Tolerance one = within(8 * kU, 0, 8 * kU);
  expect_match("p (3 steps, decay)", p, three);
  expect_match("m (3 steps)", m, three);
  expect_match("v (3 steps)", v, three);
  expect_match("p (step 7, no decay)", q, one);
  expect_match("m (step 7)", mq, one);
  expect_match("v (step 7)", vq, one);
}

// Clipping end to end: sumsq over two tensors (more than one block of kSumSqBlock), the
// coefficient, the scaling. All exact on CUDA: a product of two floats is exact in double, so a
// contracted double FMA x * x + s rounds once as the separate multiply-add does; the block and
// partial sums are double adds in a fixed order; the conversions, sqrtf, the add and the division
// of clip_coefficient and the one multiply of scale_by_scalar are IEEE.
TEST_P(KernelParity, GradientClipping) {
  const std::size_t n1 = 3 * stp::kSumSqBlock + 77, n2 = 500;
  auto g1 = upload(uniform(n1, -1, 1)), g2 = upload(uniform(n2, -2, 2));
  auto partials = upload(std::vector<float>(stp::sumsq_partials_count(n1)));
  auto sumsq = upload(std::vector<float>{0.25f}), norm = upload(std::vector<float>{-1}),
       coef = upload(std::vector<float>{-1});
  auto norm_alias = upload(std::vector<float>{0}), coef2 = upload(std::vector<float>{-1});
  run([&](Stream& s, Side at) {
    stp::sumsq_accumulate(s, at(g1), n1, at(partials), at(sumsq));  // onto 0.25
    stp::sumsq_accumulate(s, at(g2), n2, at(partials), at(sumsq));
    s.copy(at(norm_alias), at(sumsq), sizeof(float));
    stp::clip_coefficient(s, at(sumsq), 1.0f, at(norm), at(coef));
    stp::clip_coefficient(s, at(norm_alias), 1e6f, at(norm_alias), at(coef2));  // norm aliasing sumsq; coef 1
    stp::scale_by_scalar(s, at(g1), n1, at(coef));
    stp::scale_by_scalar(s, at(g2), n2, at(coef));
  });
  ASSERT_LT(download(coef, 0)[0], 1.0f) << "the test must clip";
  expect_match("sumsq", sumsq, Tolerance::exact());
  expect_match("norm", norm, Tolerance::exact());
  expect_match("coef", coef, Tolerance::exact());
  expect_match("norm (aliasing sumsq)", norm_alias, Tolerance::exact());
  expect_match("coef (clamped to 1)", coef2, Tolerance::exact());
  expect_match("g1 scaled", g1, Tolerance::exact());
  expect_match("g2 scaled", g2, Tolerance::exact());
}

// The fused pass (adamw_flat_step, sumsq_flat_accumulate): exact. Both files' arithmetic is
// compiled without contraction (nvcc --fmad=false, IEEE divide and sqrt), the norm's sums are
// double adds in a fixed order, and the clip is one f32 multiply per gradient element.
TEST_P(KernelParity, FusedClippedAdamW) {
  std::vector<stp::FlatSegment> segs;
  std::vector<stp::FlatRange> ranges;
  std::size_t n = 0;
  for (std::size_t k = 0; k < 300; ++k) {  // more runs of equal decay than one launch holds
    segs.push_back(stp::FlatSegment{k % 50 == 0 ? 3 * stp::kSumSqBlock + k : 1 + (k * 37) % 97, k % 3 != 1});
    if (k % 5 != 2) ranges.push_back(stp::FlatRange{n, segs.back().count});  // some not counted
    n += segs.back().count;
  }
  stp::AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  auto p = upload(uniform(n, -1, 1)), g = upload(uniform(n, -1, 1)), m = upload(uniform(n, -0.3f, 0.3f)),
       v = upload(uniform(n, 0.01f, 1));
  auto partials = upload(std::vector<float>(stp::sumsq_flat_partials_count(ranges)));
  auto sumsq = upload(std::vector<float>{0.25f}), norm = upload(std::vector<float>{-1}),
       coef = upload(std::vector<float>{-1});
  run([&](Stream& s, Side at) {
    stp::sumsq_flat_accumulate(s, at(g), ranges, at(partials), at(sumsq));
    stp::clip_coefficient(s, at(sumsq), 1.0f, at(norm), at(coef));
    for (int step = 1; step <= 3; ++step)
      stp::adamw_flat_step(s, at(p), at(g), at(m), at(v), segs, 0.05f, h, step, at(coef));
    stp::adamw_flat_step(s, at(p), at(g), at(m), at(v), segs, 0.05f, h, 4, nullptr);
  });
  ASSERT_LT(download(coef, 0)[0], 1.0f) << "the test must clip";
  expect_match("sumsq", sumsq, Tolerance::exact());
  expect_match("coef", coef, Tolerance::exact());
  expect_match("p", p, Tolerance::exact());
  expect_match("m", m, Tolerance::exact());
  expect_match("v", v, Tolerance::exact());
  expect_match("g (read, not written)", g, Tolerance::exact());
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelParity, ::testing::ValuesIn(stp::testing::all_kinds()),
                         stp::testing::kind_name);

}  // namespace stp::testing
