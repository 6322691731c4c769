// The cross-entropy row passes (core/kernels/softmax_rows.h): exp_nonpositive against the exact
// exponential, the three row passes against float64 references, and the AVX2 vector forms against
// the plain ones.
//
// Bounds (u = 2^-24, f32 unit roundoff):
//   exp_nonpositive(x), x in [-87, 0]: the Cephes polynomial (relative error below 2^-23 on the
//     reduced range), the reduction r = x - n ln2 (two exact products and two roundings) and the
//     final product: 4 u relative. Measured here over 2^20 arguments.
//   row_sum_exp over n terms: each of the 32 partials adds about n / 32 positive terms in order
//     (gamma_{n/32} relative, Higham 3.1), tree32 adds 5 levels: (n / 32 + 6) u, plus 4 u per term;
//     (n / 8 + 8) u of the sum, the bound of the former 8-lane order, still holds.
//   row_exp_scaled: the exponential's 4 u and the product by scale: 5 u relative per entry.
//   Plain against vector form: the same terms in the same order; they differ only where the vector
//     form fuses a multiply and an add, at most 3 ulp per exponential (measured), so the sums are
//     within the same (n / 8 + 8) u of each other (a partial sum's rounding may flip).
// A wrong lane, a dropped tail entry or a wrong shift is off by far more (each term is at least
// exp(-30) of the largest here, and rows have 1 to 8 tail entries).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/exp_nonpositive.h"
#include "core/kernels/softmax_rows.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

constexpr double kU = 1.0 / (1 << 24);

// One row as a CPU stream lays it out: one task computes the row's 32 partials.
constexpr RowReduce kRows{1, 1};
constexpr RowReduce::Part kRow{0, 0};

std::vector<float> logits(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-30.0f, 5.0f);
  std::vector<float> l(static_cast<std::size_t>(n));
  for (float& x : l) x = d(rng);
  return l;
}

double max_of(const std::vector<float>& l) {
  double m = -INFINITY;
  for (float x : l) m = std::max(m, static_cast<double>(x));
  return m;
}

// The kernels exponentiate the f32 difference l - shift: so does the reference.
double exp_of(float l, float shift) { return std::exp(static_cast<double>(l - shift)); }

double sum_exp(const std::vector<float>& l, float shift) {
  double s = 0;
  for (float x : l) s += exp_of(x, shift);
  return s;
}

const std::int64_t kLengths[] = {1, 7, 8, 9, 15, 257, 4096, 50257};

TEST(SoftmaxRows, ExpNonpositiveIsWithinFourUlpOfExp) {
  double worst = 0;
  for (int i = 0; i <= (1 << 20); ++i) {
    const float x = -87.0f * static_cast<float>(i) / (1 << 20);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_nonpositive(x) - want) / want);
  }
  std::printf("exp_nonpositive: largest relative error %.3g u\n", worst / kU);
  EXPECT_LE(worst, 4 * kU);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
}

TEST(SoftmaxRows, PassesMatchFloat64) {
  for (std::int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> l = logits(n, static_cast<std::uint32_t>(n));
    const float mx = softmax_rows::row_max(kRows, kRow, l.data(), n);
    EXPECT_EQ(static_cast<double>(mx), max_of(l));
    const double want = sum_exp(l, mx);
    EXPECT_NEAR(softmax_rows::row_sum_exp(kRows, kRow, l.data(), n, mx), want, (n / 8.0 + 8) * kU * want);
    const float shift = mx + 1.5f, scale = 0.25f;
    std::vector<float> p = l;
    softmax_rows::row_exp_scaled(p.data(), n, shift, scale);
    for (std::int64_t v = 0; v < n; ++v) {
      const double e = exp_of(l[v], shift) * scale;
      ASSERT_NEAR(p[v], e, 5 * kU * e) << "entry " << v;
    }
  }
}

TEST(SoftmaxRows, Bf16RowsReadTheirStoredValues) {
  const std::int64_t n = 1000;
  std::vector<float> l = logits(n, 3);
  std::vector<bf16> b(static_cast<std::size_t>(n));
  for (std::int64_t v = 0; v < n; ++v) {
    b[v] = from_f32<bf16>(l[v]);
    l[v] = to_f32(b[v]);  // the values the bf16 row holds
  }
  const float mx = softmax_rows::row_max(kRows, kRow, b.data(), n);
  EXPECT_EQ(static_cast<double>(mx), max_of(l));
  const double want = sum_exp(l, mx);
  EXPECT_NEAR(softmax_rows::row_sum_exp(kRows, kRow, b.data(), n, mx), want, (n / 8.0 + 8) * kU * want);
}

#if defined(STP_SOFTMAX_ROWS_SIMD_BUILT)
// bf16 rows always take the plain functions; the same values as f32 take the vector forms.
TEST(SoftmaxRows, VectorFormsMatchThePlainOnes) {
  if (!softmax_rows::simd_available())
    GTEST_SKIP() << "this CPU has no AVX2 + FMA, or STP_CPU_ISA=scalar: the plain functions run";
  double worst_ulp = 0;
  for (std::int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> l = logits(n, static_cast<std::uint32_t>(n) + 11);
    std::vector<bf16> b(static_cast<std::size_t>(n));
    for (std::int64_t v = 0; v < n; ++v) {
      b[v] = from_f32<bf16>(l[v]);
      l[v] = to_f32(b[v]);
    }
    const float mx = softmax_rows::simd_row_max(l.data(), n);
    EXPECT_EQ(mx, softmax_rows::row_max(kRows, kRow, b.data(), n));
    const float plain = softmax_rows::row_sum_exp(kRows, kRow, b.data(), n, mx);
    const float vec = softmax_rows::simd_row_sum_exp(l.data(), n, mx);
    EXPECT_NEAR(vec, plain, (n / 8.0 + 8) * kU * plain);
    for (std::int64_t v = 0; v < n; ++v) {
      const float e = exp_nonpositive(l[v] - mx);
      float one = l[v];
      softmax_rows::simd_row_exp_scaled(&one, 1, mx, 1.0f);  // the scalar tail of the vector form
      std::vector<float> eight(8, l[v]);
      softmax_rows::simd_row_exp_scaled(eight.data(), 8, mx, 1.0f);  // one full vector
      worst_ulp = std::max({worst_ulp, std::fabs(one - e) / (e * 2 * kU), std::fabs(eight[0] - e) / (e * 2 * kU)});
    }
  }
  std::printf("vector against plain exponential: largest difference %.2f ulp\n", worst_ulp);
  EXPECT_LE(worst_ulp, 3.0);
}
#endif

}  // namespace
}  // namespace stp
