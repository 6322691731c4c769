// The Llama-family kernels (core/kernels/llama_kernels.h) on the CPU backend against float64
// evaluations of their formulas: RMSNorm forward and backward, RoPE (and its backward being the
// transpose), SwiGLU forward and backward, the GQA expansion and its reduction. Tolerance: 1e-5
// relative to each output's scale (max |ours - ref| / max |ref|); the f32 kernels differ from the
// exact values by a few roundings per term (C-term sums: ~C u ~ 1e-5 at most for C = 96, typically
// far less). A wrong index or formula is off by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/kernels/llama_kernels.h"

namespace {

using i64 = std::int64_t;
constexpr double kTol = 1e-5;

class LlamaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = std::move(stp::make_cpu_devices(1)[0]);
    s_ = dev_->create_stream("compute");
  }
  void TearDown() override {
    s_->synchronize();
    for (void* p : owned_) dev_->deallocate(p);
  }
  float* buf(const std::vector<float>& host) {
    auto* p = static_cast<float*>(dev_->allocate(host.size() * sizeof(float)));
    owned_.push_back(p);
    s_->copy(p, host.data(), host.size() * sizeof(float));
    s_->synchronize();
    return p;
  }
  std::vector<float> get(const float* p, std::size_t n) {
    s_->synchronize();
    return std::vector<float>(p, p + n);  // CPU device memory is host memory
  }
  std::vector<float> uniform(std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  static double scaled_error(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      num = std::max(num, std::fabs(got[i] - want[i]));
      den = std::max(den, std::fabs(want[i]));
    }
    return num / den;
  }

  std::unique_ptr<stp::CpuDevice> dev_;
  std::unique_ptr<stp::Stream> s_;
  std::vector<void*> owned_;
  std::mt19937 rng_{20250207};
};

constexpr i64 kN = 37, kC = 96;

TEST_F(LlamaKernels, RmsNormForwardAndBackwardMatchFloat64) {
  const float eps = 1e-5f;
  auto x = uniform(kN * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), dout = uniform(kN * kC, -1, 1);
  auto resid = uniform(kN * kC, -1, 1), dw0 = uniform(kC, -1, 1);
  float *dx_ = buf(x), *dw_ = buf(w), *dd = buf(dout), *dr = buf(resid), *dwg = buf(dw0);
  float* out = buf(std::vector<float>(kN * kC));
  float* rstd = buf(std::vector<float>(kN));
  float* dx = buf(std::vector<float>(kN * kC));
  stp::rmsnorm_forward(*s_, out, rstd, dx_, dw_, kN, kC, eps);
  stp::rmsnorm_backward_input(*s_, dx, dr, dd, dx_, rstd, dw_, kN, kC);
  stp::rmsnorm_backward_weight_accumulate(*s_, dwg, dd, dx_, rstd, kN, kC);

  std::vector<double> want_out(kN * kC), want_r(kN), want_dx(kN * kC), want_dw(dw0.begin(), dw0.end());
  for (i64 n = 0; n < kN; ++n) {
    double ss = 0;
    for (i64 c = 0; c < kC; ++c) ss += double(x[n * kC + c]) * x[n * kC + c];
    const double r = 1 / std::sqrt(ss / kC + eps);
    want_r[n] = r;
    double dot = 0;  // sum_c g * xhat / C
    for (i64 c = 0; c < kC; ++c) dot += double(dout[n * kC + c]) * w[c] * x[n * kC + c] * r / kC;
    for (i64 c = 0; c < kC; ++c) {
      const double xh = x[n * kC + c] * r, g = double(dout[n * kC + c]) * w[c];
      want_out[n * kC + c] = xh * w[c];
      want_dx[n * kC + c] = resid[n * kC + c] + r * (g - xh * dot);
      want_dw[c] += dout[n * kC + c] * xh;
    }
  }
  EXPECT_LT(scaled_error(get(out, kN * kC), want_out), kTol);
  EXPECT_LT(scaled_error(get(rstd, kN), want_r), kTol);
  EXPECT_LT(scaled_error(get(dx, kN * kC), want_dx), kTol);
  EXPECT_LT(scaled_error(get(dwg, kC), want_dw), kTol);
}

TEST_F(LlamaKernels, RopeRotatesHalvesAndItsBackwardIsTheTranspose) {
  const i64 T = 7, heads = 3, D = 8, ld = heads * D + 5, N = 2 * T;  // a row wider than the heads
  const double theta = 10000.0;
  auto x = uniform(N * ld, -1, 1), y = uniform(N * ld, -1, 1);
  float *dx_ = buf(x), *dy_ = buf(y);
  stp::rope_forward(*s_, dx_, N, T, ld, heads, D, theta);
  stp::rope_backward(*s_, dy_, N, T, ld, heads, D, theta);
  auto rx = get(dx_, N * ld), ry = get(dy_, N * ld);
  std::vector<double> want(x.begin(), x.end());
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < heads; ++h)
      for (i64 i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(n % T) * std::pow(theta, -2.0 * i / D);
        const i64 j = n * ld + h * D + i, k = j + D / 2;
        want[j] = x[j] * std::cos(a) - x[k] * std::sin(a);
        want[k] = x[k] * std::cos(a) + x[j] * std::sin(a);
      }
  EXPECT_LT(scaled_error(rx, want), kTol);
  for (i64 n = 0; n < N; ++n)  // columns past the heads are untouched
    for (i64 c = heads * D; c < ld; ++c) EXPECT_EQ(rx[n * ld + c], x[n * ld + c]);
  // <R x, y> = <x, R^T y>
  double lhs = 0, rhs = 0;
  for (i64 i = 0; i < N * ld; ++i) lhs += double(rx[i]) * y[i], rhs += double(x[i]) * ry[i];
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::fabs(lhs));
}

TEST_F(LlamaKernels, SwigluForwardAndBackwardMatchFloat64) {
  const i64 F = 40;
  auto h = uniform(kN * 2 * F, -4, 4), dy = uniform(kN * F, -1, 1);
  float *dh_ = buf(h), *ddy = buf(dy), *y = buf(std::vector<float>(kN * F)), *dh = buf(std::vector<float>(kN * 2 * F));
  stp::swiglu_forward(*s_, y, dh_, kN, F);
  stp::swiglu_backward(*s_, dh, ddy, dh_, kN, F);
  std::vector<double> want_y(kN * F), want_dh(kN * 2 * F);
  for (i64 n = 0; n < kN; ++n)
    for (i64 j = 0; j < F; ++j) {
      const double g = h[n * 2 * F + j], u = h[n * 2 * F + F + j], s = 1 / (1 + std::exp(-g)), d = dy[n * F + j];
      want_y[n * F + j] = g * s * u;
      want_dh[n * 2 * F + j] = d * u * s * (1 + g * (1 - s));
      want_dh[n * 2 * F + F + j] = d * g * s;
    }
  EXPECT_LT(scaled_error(get(y, kN * F), want_y), kTol);
  EXPECT_LT(scaled_error(get(dh, kN * 2 * F), want_dh), kTol);
}

TEST_F(LlamaKernels, GqaExpandRepeatsKvHeadsAndReduceSumsGroups) {
  const i64 H = 6, K = 2, D = 4, N = 5, W = (H + 2 * K) * D;
  auto qkv = uniform(N * W, -1, 1), dfull = uniform(N * 3 * H * D, -1, 1);
  float *dq = buf(qkv), *dfl = buf(dfull), *out = buf(std::vector<float>(N * 3 * H * D)),
        *red = buf(std::vector<float>(N * W));
  stp::gqa_expand(*s_, out, dq, N, H, K, D);
  stp::gqa_reduce(*s_, red, dfl, N, H, K, D);
  auto o = get(out, N * 3 * H * D), r = get(red, N * W);
  for (i64 n = 0; n < N; ++n) {
    for (i64 c = 0; c < H * D; ++c) {
      EXPECT_EQ(o[n * 3 * H * D + c], qkv[n * W + c]);
      EXPECT_EQ(r[n * W + c], dfull[n * 3 * H * D + c]);
    }
    for (int part = 1; part <= 2; ++part)
      for (i64 h = 0; h < H; ++h)
        for (i64 e = 0; e < D; ++e)
          EXPECT_EQ(o[n * 3 * H * D + part * H * D + h * D + e],
                    qkv[n * W + H * D + (part - 1) * K * D + (h / (H / K)) * D + e]);
    for (int part = 1; part <= 2; ++part)
      for (i64 j = 0; j < K; ++j)
        for (i64 e = 0; e < D; ++e) {
          float sum = 0;
          for (i64 g = 0; g < H / K; ++g) sum += dfull[n * 3 * H * D + part * H * D + (j * (H / K) + g) * D + e];
          EXPECT_EQ(r[n * W + H * D + (part - 1) * K * D + j * D + e], sum);
        }
  }
}

}  // namespace
