// The activation runs (core/kernels/activation_rows.h): the sigmoid against the exact one, GELU,
// SwiGLU and their gradients against float64 evaluations of the same formulas, and the AVX2 vector
// forms bitwise against the plain ones.
//
// Bounds (u = 2^-24, f32 unit roundoff):
//   sigmoid(x), |x| <= 87: exp_nonpositive's 4 u (softmax_rows_test.cpp), 1 + e (u, and e <= 1 so
//     the exponential's error shrinks), the division (u), for x < 0 the product e r (u): 8 u
//     relative. Below -87 the exponential is clamped at exp(-87): the result is below 2e-38.
//   GELU, SwiGLU and the gradients: each evaluates its sigmoid at an argument z computed in f32
//     (a few roundings of |z|); an error of k u |z| in z moves sigmoid(z) by (1 - s) k u |z|
//     relative. So the bound is c u (1 + |z|) relative to the sum of the magnitudes of the
//     formula's terms (the GELU gradient's two terms cancel near x = -0.75), with c = 16: the
//     sigmoid's 8 u and up to 8 roundings of the products around it. Where z < -87 the clamped
//     exponential adds up to exp(-87) times the factors the sigmoid is multiplied by (at most
//     ~1e-35 here): `floor` below; and results in f32's subnormal range are absolute roundings.
// A wrong branch of the sigmoid, a swapped gate and up, or a wrong lane in a vector form is off by
// far more than these.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/kernels/activation_rows.h"

namespace stp {
namespace {

using namespace activation_rows;  // NOLINT(google-build-using-namespace): the functions under test

constexpr double kU = 1.0 / (1 << 24);

double sigmoid_exact(double z) { return 1.0 / (1.0 + std::exp(-z)); }

std::vector<float> inputs(std::int64_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 100.0f, -100.0f};
  for (std::size_t i = 0; i < v.size() && i < 8; ++i) v[i * 3 % v.size()] = specials[i];
  return v;
}

TEST(ActivationRows, SigmoidIsWithinEightUlpOfTheExactOne) {
  double worst = 0;
  for (int i = 0; i <= (1 << 20); ++i) {
    const float x = -87.0f + 174.0f * static_cast<float>(i) / static_cast<float>(1 << 20);
    const double exact = sigmoid_exact(x);
    const double err = std::fabs(sigmoid(x) - exact) / exact;
    worst = std::max(worst, err / kU);
    ASSERT_LE(err, 8 * kU) << "x = " << x << ": " << sigmoid(x) << " vs " << exact;
  }
  std::printf("sigmoid: worst relative error over [-87, 87]: %.2f u\n", worst);
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
  EXPECT_EQ(sigmoid(100.0f), 1.0f);
  EXPECT_LT(sigmoid(-100.0f), 2e-38f);
  EXPECT_GE(sigmoid(-100.0f), 0.0f);
}

// f64 evaluations of the formulas of the header, from the same f32 inputs.
struct Exact {
  double value, scale;  // the result, and the sum of its terms' magnitudes times (1 + |z|)
  double floor = 0;     // what the clamp at exp(-87) may add: exp(-87) times the sigmoid's factors
};

const double kClamp = 1.7e-38;    // exp_nonpositive(-87), the clamped exponential (exp(-87) = 1.65e-38)
const double kSubnormal = 1e-44;  // results below f32's normal range round to multiples of 1.4e-45

Exact gelu_exact(double v) {
  const double z = 2.0 * kGeluC * (v + kGeluA * v * v * v), s = sigmoid_exact(z);
  return {v * s, std::fabs(v * s) * (1 + std::fabs(z)), kClamp * std::fabs(v)};
}

Exact gelu_grad_exact(double v, double d) {
  const double z = 2.0 * kGeluC * (v + kGeluA * v * v * v), s = sigmoid_exact(z);
  const double du = kGeluC * (1.0 + 3.0 * kGeluA * v * v), t = v * du * 2.0 * s * (1.0 - s);
  return {d * (s + t), std::fabs(d) * (s + std::fabs(t)) * (1 + std::fabs(z)),
          kClamp * std::fabs(d) * (1 + std::fabs(v * du * 2.0))};
}

void expect_within(double got, const Exact& e, const char* what, float x) {
  ASSERT_LE(std::fabs(got - e.value), 16 * kU * e.scale + e.floor + kSubnormal) << what << " at x = " << x;
}

TEST(ActivationRows, GeluAndSwigluMatchFloat64) {
  const std::int64_t n = 1 << 16;
  const std::vector<float> x = inputs(n, -12.0f, 12.0f, 1), u = inputs(n, -3.0f, 3.0f, 2),
                           d = inputs(n, -2.0f, 2.0f, 3);
  std::vector<float> y(n), dx(n), o(n), dg(n), du(n);
  plain_gelu_run(y.data(), x.data(), n);
  plain_gelu_backward_run(dx.data(), d.data(), x.data(), n);
  plain_swiglu_run(o.data(), x.data(), u.data(), n);
  plain_swiglu_backward_run(dg.data(), du.data(), d.data(), x.data(), u.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = x[i], up = u[i], dv = d[i], s = sigmoid_exact(g), zs = 1 + std::fabs(g);
    expect_within(y[i], gelu_exact(g), "gelu", x[i]);
    expect_within(dx[i], gelu_grad_exact(g, dv), "gelu backward", x[i]);
    const double clamp = kClamp * std::fabs(g) * (1 + std::fabs(g));  // silu's gradient factor g (1 - s)
    expect_within(o[i], {g * s * up, std::fabs(g * s * up) * zs, clamp * std::fabs(up)}, "swiglu", x[i]);
    const double t = g * (1.0 - s);
    expect_within(
        dg[i],
        {dv * up * s * (1.0 + t), std::fabs(dv * up * s) * (1.0 + std::fabs(t)) * zs, clamp * std::fabs(dv * up)},
        "swiglu backward (gate)", x[i]);
    expect_within(du[i], {dv * g * s, std::fabs(dv * g * s) * zs, clamp * std::fabs(dv)}, "swiglu backward (up)", x[i]);
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ActivationRows, VectorFormsAreBitwiseThePlainOnes) {
#if defined(STP_ACTIVATION_ROWS_SIMD_BUILT)
  if (!simd_available()) GTEST_SKIP() << "this CPU has no AVX2 + FMA, or STP_CPU_ISA=scalar";
  for (std::int64_t n : {1, 7, 8, 9, 15, 257, 1024, 4099}) {
    const std::vector<float> x = inputs(n, -12.0f, 12.0f, 10 + static_cast<std::uint32_t>(n)),
                             u = inputs(n, -3.0f, 3.0f, 20), d = inputs(n, -2.0f, 2.0f, 30);
    std::vector<float> plain(n), vec(n), plain2(n), vec2(n);
    plain_gelu_run(plain.data(), x.data(), n);
    simd_gelu_run(vec.data(), x.data(), n);
    EXPECT_TRUE(same_bits(plain, vec)) << "gelu, n = " << n;
    plain_gelu_backward_run(plain.data(), d.data(), x.data(), n);
    simd_gelu_backward_run(vec.data(), d.data(), x.data(), n);
    EXPECT_TRUE(same_bits(plain, vec)) << "gelu backward, n = " << n;
    plain_swiglu_run(plain.data(), x.data(), u.data(), n);
    simd_swiglu_run(vec.data(), x.data(), u.data(), n);
    EXPECT_TRUE(same_bits(plain, vec)) << "swiglu, n = " << n;
    plain_swiglu_backward_run(plain.data(), plain2.data(), d.data(), x.data(), u.data(), n);
    simd_swiglu_backward_run(vec.data(), vec2.data(), d.data(), x.data(), u.data(), n);
    EXPECT_TRUE(same_bits(plain, vec)) << "swiglu backward (gate), n = " << n;
    EXPECT_TRUE(same_bits(plain2, vec2)) << "swiglu backward (up), n = " << n;
  }
#else
  GTEST_SKIP() << "no vector forms in this build";
#endif
}

}  // namespace
}  // namespace stp
