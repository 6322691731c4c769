// Kernel parity of the Llama-family kernels (llama_kernels.h): RMSNorm, RoPE, SwiGLU and the
// grouped-query expand/reduce. The KernelParity suite's fixture and tolerance rules are in
// tests/support/kernel_parity.h and tests/core/kernel_parity_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/llama_kernels.h"
#include "tests/support/kernel_parity.h"

// In stp::testing (not an anonymous namespace): the cases are members of the shared fixture.
namespace stp::testing {

using i64 = std::int64_t;

// ---- Llama-family kernels (llama_kernels.h) -----------------------------------------------------------

// rstd: C squares summed (contracted on CUDA), + eps, sqrtf, 1 / .: as LayerNorm's rstd,
// (C + 8) u relative. out = x * rstd * w: two products carrying rstd's error, no cancellation:
// (C + 16) u relative.
template <typename T>
void KernelParity::rmsnorm_forward_case() {
  auto x = upload(uniform(kRows * kC, -2, 3)), w = upload(uniform(kC, 0.5f, 1.5f));
  auto out = upload(values<T>(kRows * kC, -9, 9)), rstd = upload(uniform(kRows, -9, 9));
  run([&](Stream& s, Side at) { stp::rmsnorm_forward(s, at(out), at(rstd), at(x), at(w), kRows, kC, 1e-5f); });
  expect_match("rstd", rstd, within((kC + 8) * kU));
  expect_match("out", out, stored_as<T>(within((kC + 16) * kU)));
}

TEST_P(KernelParity, RmsNormForward) { rmsnorm_forward_case<float>(); }
TEST_P(KernelParity, RmsNormForwardBf16) { rmsnorm_forward_case<bf16>(); }

// dx = resid + rstd * (g - xhat * mean(g * xhat)), g = dout * w: the row mean is a C-term sum of
// products (within 2 gamma_{C+2} sum|g xhat| / C of each other across backends); it enters dx
// times rstd |xhat|. The elementwise part (5 operations and the residual add) adds 8 u of its terms.
// dw += sum_n dout * xhat: an N-term dot product, LayerNormBackwardWeight's bound.
TEST_P(KernelParity, RmsNormBackward) {
  auto x = uniform(kRows * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), dout = uniform(kRows * kC, -1, 1);
  std::vector<float> r(kRows);
  for (i64 n = 0; n < kRows; ++n) {
    double s2 = 0;
    for (i64 c = 0; c < kC; ++c) s2 += std::pow(x[static_cast<std::size_t>(n * kC + c)], 2);
    r[static_cast<std::size_t>(n)] = static_cast<float>(1 / std::sqrt(s2 / kC + 1e-5));
  }
  auto dwi = uniform(kC, -1, 1);
  auto dx_ = upload(x), dw_ = upload(w), dd = upload(dout), dr = upload(r), dwg = upload(dwi);
  auto resid = upload(uniform(kRows * kC, -1, 1)), out = upload(uniform(kRows * kC, -9, 9));
  run([&](Stream& s, Side at) {
    stp::rmsnorm_backward_input(s, at(out), at(resid), at(dd), at(dx_), at(dr), at(dw_), kRows, kC);
    stp::rmsnorm_backward_weight_accumulate(s, at(dwg), at(dd), at(dx_), at(dr), kRows, kC);
  });
  std::vector<double> bound(kRows * kC), wbound(kC, 0.0);
  const double gamma = (kC + 2) * kU / (1 - (kC + 2) * kU);
  for (i64 n = 0; n < kRows; ++n) {
    const double rs = r[static_cast<std::size_t>(n)];
    double sgx = 0, gx_mean = 0;
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = x[i] * rs;
      sgx += std::fabs(g * xh), gx_mean += g * xh / kC;
      wbound[static_cast<std::size_t>(c)] += std::fabs(double(dout[i]) * xh);
    }
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = x[i] * rs;
      double mean = rs * std::fabs(xh) * 2 * gamma * sgx / kC;
      bound[i] = 2 * (mean + 8 * kU * (rs * (std::fabs(g) + std::fabs(xh * gx_mean)) + 1.0));
    }
  }
  for (i64 c = 0; c < kC; ++c)
    wbound[static_cast<std::size_t>(c)] =
        2 * (kRows + 4) * kU * (wbound[static_cast<std::size_t>(c)] + std::fabs(dwi[static_cast<std::size_t>(c)]));
  expect_match("dx", out, per_element(bound));
  expect_match("dw", dwg, per_element(wbound));
}

// RoPE: the angle, cos and sin in double (within a few double ulps across backends), rounded to
// f32: c and s at most 1 f32 rounding apart. x1 c - x2 s (one product may be contracted) then
// differs by 4 u (|x1| + |x2|) <= 8 u for |x| <= 1, plus 2 u of the result: within(2 u, 8 u).
template <typename T>
void KernelParity::rope_case() {
  const i64 T_ = 9, heads = 5, D = 16, ld = heads * D + 3, N = 3 * T_;
  auto fwd = upload(values<T>(N * ld, -1, 1));
  auto bwd = upload(values<T>(N * ld, -1, 1));
  run([&](Stream& s, Side at) {
    stp::rope_forward(s, at(fwd), N, T_, ld, heads, D, 10000.0);
    stp::rope_backward(s, at(bwd), N, T_, ld, heads, D, 500000.0);
  });
  expect_match("rope", fwd, stored_as<T>(within(2 * kU, 8 * kU)));
  expect_match("rope backward", bwd, stored_as<T>(within(2 * kU, 8 * kU)));
}

TEST_P(KernelParity, Rope) { rope_case<float>(); }
TEST_P(KernelParity, RopeBf16) { rope_case<bf16>(); }

// silu(g) u: the sigmoid's exp_nonpositive 3 ulp apart (where one side fuses a multiply-add of the
// polynomial), 1 + e, the quotient, e times it (g < 0) and two products add 6 roundings, no
// cancellation: 16 u relative. Backward dg = dy u s (1 + g (1 - s)): 1 - s and 1 + g (1 - s) can
// cancel, so their error (6 u of s, times |g| <= 4, plus 4 u) is absolute in |dy u s| <= 1: 64 u;
// du = dy g s: 16 u relative.
template <typename T>
void KernelParity::swiglu_case() {
  const i64 F = 333;
  auto h = upload(values<T>(kRows * 2 * F, -4, 4)), dy = upload(values<T>(kRows * F, -1, 1));
  auto y = upload(values<T>(kRows * F, -9, 9)), dh = upload(values<T>(kRows * 2 * F, -9, 9));
  run([&](Stream& s, Side at) {
    stp::swiglu_forward(s, at(y), at(h), kRows, F);
    stp::swiglu_backward(s, at(dh), at(dy), at(h), kRows, F);
  });
  expect_match("y", y, stored_as<T>(within(16 * kU)));
  expect_match("dh", dh, stored_as<T>(within(16 * kU, 64 * kU)));
}

TEST_P(KernelParity, Swiglu) { swiglu_case<float>(); }
TEST_P(KernelParity, SwigluBf16) { swiglu_case<bf16>(); }

// Copies, and sums of a group's values in group order (adds only): exact.
template <typename T>
void KernelParity::gqa_case() {
  const i64 H = 8, K = 2, D = 12, N = 300;
  auto qkv = upload(values<T>(N * (H + 2 * K) * D, -1, 1)), dfull = upload(values<T>(N * 3 * H * D, -1, 1));
  auto out = upload(values<T>(N * 3 * H * D, -9, 9)), red = upload(values<T>(N * (H + 2 * K) * D, -9, 9));
  run([&](Stream& s, Side at) {
    stp::gqa_expand(s, at(out), at(qkv), N, H, K, D);
    stp::gqa_reduce(s, at(red), at(dfull), N, H, K, D);
  });
  expect_match("expand", out, Tolerance::exact());
  expect_match("reduce", red, Tolerance::exact());
}

TEST_P(KernelParity, Gqa) { gqa_case<float>(); }
TEST_P(KernelParity, GqaBf16) { gqa_case<bf16>(); }

}  // namespace stp::testing
