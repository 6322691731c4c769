// Kernel parity of Stream::gemm (core/device.h; gemm_kernels.h for k == 0) and of the linear
// layers built on it (nn_kernels.h: linear forward, backward input and weight, column sums): the
// device under test against the CpuDevice oracle. The fixture is tests/support/kernel_parity.h;
// kernel_parity_test.cpp's header derives the tolerances (f32 summation order, tensor cores' bf16
// accumulation, one bf16 rounding per stored output), and instantiates the suite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/nn_kernels.h"
#include "tests/support/kernel_parity.h"

// In stp::testing (not an anonymous namespace): the cases are members of the shared fixture.
namespace stp::testing {

using i64 = std::int64_t;

// ---- GEMM error bound -------------------------------------------------------------------------------

// The rounding unit of cuBLAS's f32 accumulation: u for f32 operands (IEEE FFMA on CUDA cores);
// 2u for bf16 operands, which run on tensor cores whose f32 accumulation truncates instead of
// rounding to nearest (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
// cores", PeerJ Computer Science 2021). bf16 products are exact in f32.
template <typename TA>
constexpr double accumulation_u() {
  return std::is_same_v<TA, float> ? kU : 2 * kU;
}

// Per element of C = alpha * op(A) op(B) + beta * C0 (row-major, GemmArgs conventions; a, b, c0
// as f32 values): the largest difference between two f32 evaluations in different orders,
// 2 * gamma_{K+2} * (|alpha| sum_p |a_ip b_pj| + |beta c_ij|) (K products, the alpha scaling and
// the beta add; see the file header), with gamma_n = n acc_u / (1 - n acc_u).
std::vector<double> gemm_bound(const stp::GemmArgs& g, const std::vector<float>& a, const std::vector<float>& b,
                               const std::vector<float>& c0, double acc_u = kU) {
  const double gamma = (g.k + 2) * acc_u / (1 - (g.k + 2) * acc_u);
  std::vector<double> out(static_cast<std::size_t>(g.m) * g.n);
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0;
      for (int p = 0; p < g.k; ++p) {
        double av = g.trans_a ? a[static_cast<std::size_t>(p) * g.lda + i] : a[static_cast<std::size_t>(i) * g.lda + p];
        double bv = g.trans_b ? b[static_cast<std::size_t>(j) * g.ldb + p] : b[static_cast<std::size_t>(p) * g.ldb + j];
        s += std::fabs(av * bv);
      }
      double c = g.beta != 0 ? std::fabs(g.beta * c0[static_cast<std::size_t>(i) * g.ldc + j]) : 0;
      out[static_cast<std::size_t>(i) * g.n + j] = 2 * gamma * (std::fabs(g.alpha) * s + c);
    }
  return out;
}

// ---- Stream::gemm -----------------------------------------------------------------------------------

// Every transposition, alpha/beta, leading dimensions wider than the matrices (as attention's
// head slices use), K = 1. Tolerance: gemm_bound per element, plus one bf16 rounding for a bf16 C.
// ldc == n here so C is compared whole.
template <typename TA, typename TC>
void KernelParity::gemm_case() {
  struct Shape {
    int m, n, k;
  };
  for (Shape sh : {Shape{37, 29, 53}, Shape{64, 48, 300}, Shape{5, 70, 1}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(::testing::Message() << sh.m << "x" << sh.n << "x" << sh.k << " ta=" << ta << " tb=" << tb);
        stp::GemmArgs g;
        g.trans_a = ta, g.trans_b = tb;
        g.m = sh.m, g.n = sh.n, g.k = sh.k;
        g.alpha = 0.75f, g.beta = -1.5f;
        g.lda = (ta ? sh.m : sh.k) + 3, g.ldb = (tb ? sh.k : sh.n) + 5, g.ldc = sh.n;
        g.ab = stp::dtype_of<TA>(), g.c_type = stp::dtype_of<TC>();
        auto a = values<TA>(static_cast<std::size_t>(ta ? sh.k : sh.m) * g.lda, -1, 1);
        auto b = values<TA>(static_cast<std::size_t>(tb ? sh.n : sh.k) * g.ldb, -1, 1);
        auto c = values<TC>(static_cast<std::size_t>(sh.m) * sh.n, -1, 1);
        auto da = upload(a), db = upload(b);
        auto dc = upload(c);
        run([&](Stream& s, Side at) {
          stp::GemmArgs h = g;
          h.a = at(da), h.b = at(db), h.c = at(dc);
          s.gemm(h);
        });
        expect_match(
            "C", dc,
            stored_as<TC>(per_element(gemm_bound(g, widened(a), widened(b), widened(c), accumulation_u<TA>()))));
      }
}

TEST_P(KernelParity, Gemm) { gemm_case<float, float>(); }
TEST_P(KernelParity, GemmBf16) {
  gemm_case<bf16, float>();
  gemm_case<bf16, bf16>();
}

// The single-rounding rule for bf16 outputs (docs/gpu-readiness.md, cuBLAS) on the shape where
// a GPU library splits K: a 32 x 32 output (one tile) over K = 2048, whose first half of products is
// positive and second half negative, so partial sums over runs of K are ~ 500 while C is ~ 5. A
// split-K reduction that rounded its partial sums to bf16 (cuBLASLt's INPLACE or OUTPUT_TYPE schemes
// on a bf16 output) would be off by up to 2^-8 of a partial, ~ 2, per part; the bound allows the
// summation-order bound (~ 0.6 here) plus one bf16 rounding of C (~ 0.03), so a second rounding of
// the parts fails it while any f32 order with one final rounding passes.
TEST_P(KernelParity, GemmBf16RoundsOnceOverLongSums) {
  constexpr int kM = 32, kN = 32, kK = 2048;
  stp::GemmArgs g;
  g.m = kM, g.n = kN, g.k = kK;
  g.lda = kK, g.ldb = kN, g.ldc = kN;
  g.ab = stp::DType::Bf16, g.c_type = stp::DType::Bf16;
  auto a = values<bf16>(static_cast<std::size_t>(kM) * kK, 0.5f, 1.0f);
  auto b = values<bf16>(static_cast<std::size_t>(kK / 2) * kN, 0.5f, 1.0f);
  auto negative = values<bf16>(static_cast<std::size_t>(kK / 2) * kN, -1.0f, -0.5f);
  b.insert(b.end(), negative.begin(), negative.end());  // rows k >= K/2 of B are negative
  auto c = values<bf16>(static_cast<std::size_t>(kM) * kN, -9, 9);
  auto da = upload(a), db = upload(b), dc = upload(c);
  run([&](Stream& s, Side at) {
    stp::GemmArgs h = g;
    h.a = at(da), h.b = at(db), h.c = at(dc);
    s.gemm(h);
  });
  expect_match("C", dc,
               stored_as<bf16>(per_element(gemm_bound(g, widened(a), widened(b), widened(c), accumulation_u<bf16>()))));
}

// K = 0: C = beta·C, with no product (core/kernels/gemm_kernels.h, which both backends' gemm run).
// beta = 0 writes zeros over a C of NaN without reading it; beta = -1.5 scales every element (one
// f32 product of values with short significands: exact, then one rounding for a bf16 C); the
// columns past n in rows of ldc > n are untouched. Asserted exactly on both sides.
TEST_P(KernelParity, GemmWithoutProduct) {
  constexpr int kM = 7, kN = 5, kLdc = 8;
  for (stp::DType c_type : {stp::DType::F32, stp::DType::Bf16})
    for (float beta : {0.0f, -1.5f}) {
      SCOPED_TRACE(::testing::Message() << (c_type == stp::DType::Bf16 ? "bf16" : "f32") << " C, beta=" << beta);
      const bool bf = c_type == stp::DType::Bf16;
      std::vector<float> c(static_cast<std::size_t>(kM) * kLdc);
      for (std::size_t i = 0; i < c.size(); ++i)
        c[i] = beta == 0.0f && i % kLdc < kN ? std::nanf("") : static_cast<float>(i % 13) - 6.0f;
      std::vector<float> want = c;
      for (int r = 0; r < kM; ++r)
        for (int j = 0; j < kN; ++j) {
          float& w = want[static_cast<std::size_t>(r) * kLdc + j];
          w = beta == 0.0f ? 0.0f : beta * w;
        }
      stp::GemmArgs g;
      g.m = kM, g.n = kN, g.k = 0, g.lda = 1, g.ldb = kN, g.ldc = kLdc, g.beta = beta, g.alpha = 2.0f;
      g.ab = stp::DType::Bf16, g.c_type = c_type;
      std::vector<bf16> cb(c.size());
      for (std::size_t i = 0; i < c.size(); ++i) cb[i] = stp::from_f32<bf16>(c[i]);
      auto df = upload(c);
      auto db = upload(cb);
      run([&](Stream& s, Side at) {
        stp::GemmArgs h = g;
        h.c = bf ? static_cast<void*>(at(db)) : static_cast<void*>(at(df));
        s.gemm(h);
      });
      for (int side = 0; side < 2; ++side) {
        std::vector<float> got = bf ? widened(download(db, side)) : download(df, side);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << "side " << side << " element " << i;  // NaN != anything: fails
      }
    }
}

// ---- Linear layers -----------------------------------------------------------------------------

constexpr i64 kIn = 48, kOut = 72;

// y = init + x W, init = bias (+ resid) (one f32 add stored as TC, the same on both sides): a GEMM
// with beta = 1 and C0 = init. Instantiated as f32 -> f32, bf16 -> bf16, and bf16 -> f32 (the
// row-parallel layers' f32 partial sums).
template <typename TA, typename TC>
void KernelParity::linear_forward_case() {
  auto x = values<TA>(kRows * kIn, -1, 1), W = values<TA>(kIn * kOut, -0.5f, 0.5f);
  auto bias = uniform(kOut, -1, 1);
  auto resid = values<TC>(kRows * kOut, -1, 1);
  auto dx_ = upload(x), dW = upload(W);
  auto db = upload(bias);
  auto dr = upload(resid);
  auto y_full = upload(values<TC>(kRows * kOut, -9, 9)), y_bias = upload(values<TC>(kRows * kOut, -9, 9)),
       y_none = upload(values<TC>(kRows * kOut, -9, 9));
  run([&](Stream& s, Side at) {
    stp::linear_forward(s, at(y_full), at(dx_), at(dW), at(db), at(dr), kRows, kIn, kOut);
    stp::linear_forward(s, at(y_bias), at(dx_), at(dW), at(db), nullptr, kRows, kIn, kOut);
    stp::linear_forward(s, at(y_none), at(dx_), at(dW), nullptr, nullptr, kRows, kIn, kOut);
  });
  stp::GemmArgs g;
  g.m = kRows, g.n = kOut, g.k = kIn, g.lda = kIn, g.ldb = kOut, g.ldc = kOut;
  g.beta = 1;
  const auto xf = widened(x), Wf = widened(W), rf = widened(resid);
  std::vector<float> init_full(kRows * kOut), init_bias(kRows * kOut);
  for (std::size_t i = 0; i < init_full.size(); ++i) {
    init_bias[i] = stp::to_f32(stp::from_f32<TC>(bias[i % kOut]));
    init_full[i] = stp::to_f32(stp::from_f32<TC>(bias[i % kOut] + rf[i]));
  }
  const double acc = accumulation_u<TA>();
  expect_match("y = x W + bias + resid", y_full, stored_as<TC>(per_element(gemm_bound(g, xf, Wf, init_full, acc))));
  expect_match("y = x W + bias", y_bias, stored_as<TC>(per_element(gemm_bound(g, xf, Wf, init_bias, acc))));
  g.beta = 0;
  expect_match("y = x W", y_none, stored_as<TC>(per_element(gemm_bound(g, xf, Wf, {}, acc))));
}

TEST_P(KernelParity, LinearForward) { linear_forward_case<float, float>(); }
TEST_P(KernelParity, LinearForwardBf16) {
  linear_forward_case<bf16, bf16>();
  linear_forward_case<bf16, float>();
}

// dx = dy W^T: a GEMM with K = out.
template <typename TA, typename TC>
void KernelParity::linear_backward_input_case() {
  auto dy = values<TA>(kRows * kOut, -1, 1), W = values<TA>(kIn * kOut, -0.5f, 0.5f);
  auto ddy = upload(dy), dW = upload(W);
  auto dx = upload(values<TC>(kRows * kIn, -9, 9));
  run([&](Stream& s, Side at) { stp::linear_backward_input(s, at(dx), at(ddy), at(dW), kRows, kIn, kOut); });
  stp::GemmArgs g;
  g.trans_b = true;
  g.m = kRows, g.n = kIn, g.k = kOut, g.lda = kOut, g.ldb = kOut, g.ldc = kIn;
  expect_match("dx", dx, stored_as<TC>(per_element(gemm_bound(g, widened(dy), widened(W), {}, accumulation_u<TA>()))));
}

TEST_P(KernelParity, LinearBackwardInput) { linear_backward_input_case<float, float>(); }
TEST_P(KernelParity, LinearBackwardInputBf16) {
  linear_backward_input_case<bf16, bf16>();
  linear_backward_input_case<bf16, float>();
}

// dW += x^T dy (a GEMM with K = N, beta = 1; dW is f32), dbias += column sums of dy (adds of
// exactly widened values only: exact).
template <typename TA>
void KernelParity::linear_backward_weight_case() {
  auto x = values<TA>(kRows * kIn, -1, 1), dy = values<TA>(kRows * kOut, -1, 1);
  auto W0 = uniform(kIn * kOut, -1, 1), b0 = uniform(kOut, -1, 1);
  auto dx_ = upload(x), ddy = upload(dy);
  auto dW = upload(W0), db = upload(b0), dW_only = upload(W0);
  run([&](Stream& s, Side at) {
    stp::linear_backward_weight_accumulate(s, at(dW), at(db), at(dx_), at(ddy), kRows, kIn, kOut);
    stp::linear_backward_weight_accumulate(s, at(dW_only), nullptr, at(dx_), at(ddy), kRows, kIn, kOut);
  });
  stp::GemmArgs g;
  g.trans_a = true;
  g.m = kIn, g.n = kOut, g.k = kRows, g.lda = kIn, g.ldb = kOut, g.ldc = kOut;
  g.beta = 1;
  const auto bound = gemm_bound(g, widened(x), widened(dy), W0, accumulation_u<TA>());
  expect_match("dW", dW, per_element(bound));
  expect_match("dW (no bias)", dW_only, per_element(bound));
  expect_match("dbias", db, Tolerance::exact());
}

TEST_P(KernelParity, LinearBackwardWeight) { linear_backward_weight_case<float>(); }
TEST_P(KernelParity, LinearBackwardWeightBf16) { linear_backward_weight_case<bf16>(); }

// db[j] += sum_n dy[n, j]: adds (of exactly widened values) in row order only: exact.
template <typename T>
void KernelParity::column_sum_case() {
  const i64 n = 513, m = 300;
  auto dy = upload(values<T>(n * m, -1, 1));
  auto db = upload(uniform(m, -1, 1));
  run([&](Stream& s, Side at) { stp::column_sum_accumulate(s, at(db), at(dy), n, m); });
  expect_match("db", db, Tolerance::exact());
}

TEST_P(KernelParity, ColumnSum) { column_sum_case<float>(); }
TEST_P(KernelParity, ColumnSumBf16) { column_sum_case<bf16>(); }

}  // namespace stp::testing
