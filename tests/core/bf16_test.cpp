// bf16 storage (core/dtype.h) and the bf16 instantiations of the kernels on the CPU backend.
//
// The CPU backend is the oracle of the bf16 path, so its rules are asserted exactly:
//   * rounding is to nearest, ties to even (hand-picked ties, NaN, infinities, overflow, and the
//     nearest-neighbour property on 200k random bit patterns);
//   * a bf16 GEMM is the f32 GEMM of the widened operands, rounded once when C is bf16;
//   * an elementwise or row kernel on bf16 is its f32 instantiation on the widened inputs,
//     rounded once on store (the kernels load exactly, compute in f32, round on store);
//   * attention, where intermediate scores are rounded too, stays within a few bf16 roundings of
//     the f32 result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/dtype.h"
#include "core/kernels/nn_kernels.h"

namespace {

using stp::bf16;
using stp::from_f32;
using stp::to_f32;

std::uint16_t round_bits(float f) { return from_f32<bf16>(f).bits; }
float from_bits(std::uint32_t u) { return stp::bits_float(u); }

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(round_bits(1.0f), 0x3f80);
  EXPECT_EQ(round_bits(from_bits(0x3f808000)), 0x3f80);  // tie between 0x3f80 (even) and 0x3f81
  EXPECT_EQ(round_bits(from_bits(0x3f818000)), 0x3f82);  // tie between 0x3f81 and 0x3f82 (even)
  EXPECT_EQ(round_bits(from_bits(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(round_bits(from_bits(0x3f807fff)), 0x3f80);  // just below it
  EXPECT_EQ(round_bits(-1.5f), 0xbfc0);
  EXPECT_EQ(round_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(round_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(round_bits(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf, as IEEE
  EXPECT_TRUE(std::isnan(to_f32(from_f32<bf16>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(to_f32(from_f32<bf16>(from_bits(0x7f800001)))));  // a NaN whose top half is inf
  EXPECT_EQ(round_bits(from_bits(0x00000001)), 0x0000);                    // the smallest subnormal rounds to zero
}

TEST(Bf16, EveryRoundingIsTheNearestNeighbour) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = rng();
    float x = from_bits(u);
    if (!std::isfinite(x) || std::fabs(x) >= 3.38e38f) continue;  // NaN/inf checked above; no overflow here
    const std::uint16_t r = round_bits(x);
    const double down = to_f32(bf16{static_cast<std::uint16_t>(u >> 16)});
    const double up = to_f32(bf16{static_cast<std::uint16_t>((u >> 16) + 1)});
    const double err = std::fabs(x - static_cast<double>(to_f32(bf16{r})));
    ASSERT_LE(err, std::min(std::fabs(x - down), std::fabs(x - up))) << std::hex << u;
    ASSERT_TRUE(r == (u >> 16) || r == ((u >> 16) + 1)) << std::hex << u;
    EXPECT_EQ(to_f32(bf16{r}), to_f32(from_f32<bf16>(to_f32(bf16{r}))));  // bf16 values are fixed points
  }
}

// CPU device memory is host memory: tests read and write it directly after synchronizing.
class Bf16Kernels : public ::testing::Test {
 protected:
  template <typename T>
  T* alloc(std::size_t n) {
    void* p = device_->allocate(n * sizeof(T));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // n random values, already representable in bf16 (so f32 and bf16 see the same inputs).
  std::vector<float> values(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = to_f32(from_f32<bf16>(dist(rng_)));
    return v;
  }
  float* f32_of(const std::vector<float>& v) {
    float* p = alloc<float>(v.size());
    std::memcpy(p, v.data(), v.size() * sizeof(float));
    return p;
  }
  bf16* bf16_of(const std::vector<float>& v) {
    bf16* p = alloc<bf16>(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = from_f32<bf16>(v[i]);
    return p;
  }
  // The bf16 result must be the f32 result rounded, element for element.
  void expect_rounded(const bf16* got, const float* f32, std::size_t n, const char* what) {
    s_->synchronize();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, from_f32<bf16>(f32[i]).bits) << what << " element " << i;
  }
  void TearDown() override {
    s_->synchronize();
    for (void* p : ptrs_) device_->deallocate(p);
  }

  std::unique_ptr<stp::CpuDevice> device_ = std::move(stp::make_cpu_devices(1).front());
  std::unique_ptr<stp::Stream> s_ = device_->create_stream("compute");
  std::vector<void*> ptrs_;
  std::mt19937 rng_{11};
};

TEST_F(Bf16Kernels, GemmIsTheF32GemmOfTheWidenedOperandsRoundedOnce) {
  const int m = 7, n = 9, k = 13;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        auto a = values(static_cast<std::size_t>(m * k)), b = values(static_cast<std::size_t>(k * n));
        auto c0 = values(static_cast<std::size_t>(m * n));
        const int lda = ta ? m : k, ldb = tb ? k : n;
        float* cf = f32_of(c0);
        bf16* cb = bf16_of(c0);
        float* cf_out = f32_of(c0);
        stp::gemm(*s_, ta, tb, m, n, k, f32_of(a), lda, f32_of(b), ldb, cf, n, 0.5f, beta);
        stp::gemm(*s_, ta, tb, m, n, k, bf16_of(a), lda, bf16_of(b), ldb, cb, n, 0.5f, beta);
        stp::gemm(*s_, ta, tb, m, n, k, bf16_of(a), lda, bf16_of(b), ldb, cf_out, n, 0.5f, beta);
        s_->synchronize();
        EXPECT_EQ(0, std::memcmp(cf, cf_out, sizeof(float) * m * n)) << "bf16 x bf16 -> f32";
        expect_rounded(cb, cf, static_cast<std::size_t>(m * n), "bf16 x bf16 -> bf16");
      }
}

TEST_F(Bf16Kernels, ElementwiseAndRowKernelsRoundTheF32ResultOnce) {
  const std::int64_t N = 6, C = 40, V = 50;
  const std::size_t nc = static_cast<std::size_t>(N * C), nv = static_cast<std::size_t>(N * V);
  // LayerNorm (f32 input, bf16 output).
  {
    auto x = values(nc), w = values(static_cast<std::size_t>(C)), b = values(static_cast<std::size_t>(C));
    float *of = alloc<float>(nc), *mean = alloc<float>(static_cast<std::size_t>(N)),
          *rstd = alloc<float>(static_cast<std::size_t>(N));
    bf16* ob = alloc<bf16>(nc);
    stp::layernorm_forward(*s_, of, mean, rstd, f32_of(x), f32_of(w), f32_of(b), N, C);
    stp::layernorm_forward(*s_, ob, mean, rstd, f32_of(x), f32_of(w), f32_of(b), N, C);
    expect_rounded(ob, of, nc, "layernorm_forward");
  }
  // GELU forward and backward.
  {
    auto x = values(nc, 2.0f), dy = values(nc);
    float* yf = alloc<float>(nc);
    bf16* yb = alloc<bf16>(nc);
    stp::gelu_forward(*s_, yf, f32_of(x), static_cast<std::int64_t>(nc));
    stp::gelu_forward(*s_, yb, bf16_of(x), static_cast<std::int64_t>(nc));
    expect_rounded(yb, yf, nc, "gelu_forward");
    float* df = f32_of(dy);
    bf16* db = bf16_of(dy);
    stp::gelu_backward(*s_, df, df, f32_of(x), static_cast<std::int64_t>(nc));
    stp::gelu_backward(*s_, db, db, bf16_of(x), static_cast<std::int64_t>(nc));
    expect_rounded(db, df, nc, "gelu_backward");
  }
  // Cross-entropy: identical f32 losses from identical (widened) logits; dlogits rounded once.
  {
    auto logits = values(nv, 3.0f);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 17) % V);
    auto* t = alloc<std::int32_t>(targets.size());
    std::memcpy(t, targets.data(), targets.size() * sizeof(std::int32_t));
    float *lf = f32_of(logits), *loss = alloc<float>(2), *losses = alloc<float>(2 * static_cast<std::size_t>(N)),
          *lse = alloc<float>(2 * static_cast<std::size_t>(N));
    bf16* lb = bf16_of(logits);
    stp::cross_entropy_forward(*s_, loss, losses, lse, lf, t, N, V);
    stp::cross_entropy_forward(*s_, loss + 1, losses + N, lse + N, lb, t, N, V);
    s_->synchronize();
    EXPECT_EQ(loss[0], loss[1]);
    for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(lse[i], lse[N + i]);
    stp::cross_entropy_backward_inplace(*s_, lf, lse, t, 0.25f, N, V);
    stp::cross_entropy_backward_inplace(*s_, lb, lse, t, 0.25f, N, V);
    expect_rounded(lb, lf, nv, "cross_entropy_backward_inplace");
  }
  // Column sums of bf16 gradients accumulate in f32 exactly as from the widened values.
  {
    auto dy = values(nc);
    float* sf = f32_of(std::vector<float>(static_cast<std::size_t>(C), 1.0f));
    float* sb = f32_of(std::vector<float>(static_cast<std::size_t>(C), 1.0f));
    stp::column_sum_accumulate(*s_, sf, f32_of(dy), N, C);
    stp::column_sum_accumulate(*s_, sb, bf16_of(dy), N, C);
    s_->synchronize();
    EXPECT_EQ(0, std::memcmp(sf, sb, sizeof(float) * static_cast<std::size_t>(C)));
  }
}

// Scores and probabilities are rounded between the attention GEMMs, so bf16 attention is not the
// rounded f32 one; it stays within a few roundings: scaled error (max |Δ| / max |f32|) below
// 2e-2 for y, att and dqkv (measured 3e-3 .. 4e-3).
TEST_F(Bf16Kernels, AttentionStaysWithinAFewRoundingsOfF32) {
  const std::int64_t B = 2, T = 8, NH = 2, D = 4, W = NH * D;
  const std::size_t nqkv = static_cast<std::size_t>(B * T * 3 * W), ny = static_cast<std::size_t>(B * T * W),
                    natt = static_cast<std::size_t>(B * NH * T * T);
  auto qkv = values(nqkv), dy = values(ny);
  float *yf = alloc<float>(ny), *af = alloc<float>(natt), *dqf = alloc<float>(nqkv), *daf = alloc<float>(natt);
  bf16 *yb = alloc<bf16>(ny), *ab = alloc<bf16>(natt), *dqb = alloc<bf16>(nqkv), *dab = alloc<bf16>(natt);
  stp::attention_forward(*s_, yf, af, f32_of(qkv), B, T, NH, D);
  stp::attention_forward(*s_, yb, ab, bf16_of(qkv), B, T, NH, D);
  stp::attention_backward(*s_, dqf, daf, f32_of(dy), f32_of(qkv), af, B, T, NH, D);
  stp::attention_backward(*s_, dqb, dab, bf16_of(dy), bf16_of(qkv), ab, B, T, NH, D);
  s_->synchronize();
  auto scaled_error = [](const bf16* got, const float* want, std::size_t n) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < n; ++i) {
      num = std::max(num, std::fabs(static_cast<double>(to_f32(got[i])) - want[i]));
      den = std::max(den, std::fabs(static_cast<double>(want[i])));
    }
    return num / den;
  };
  std::printf("[ bf16 attention ] scaled error y %.1e att %.1e dqkv %.1e\n", scaled_error(yb, yf, ny),
              scaled_error(ab, af, natt), scaled_error(dqb, dqf, nqkv));
  EXPECT_LT(scaled_error(yb, yf, ny), 2e-2);
  EXPECT_LT(scaled_error(ab, af, natt), 2e-2);
  EXPECT_LT(scaled_error(dqb, dqf, nqkv), 2e-2);
  EXPECT_GT(scaled_error(dqb, dqf, nqkv), 0.0) << "bf16 must round something";
  for (std::int64_t r = 0; r < B * NH * T; ++r)  // causal: exact zeros above the diagonal
    for (std::int64_t j = r % T + 1; j < T; ++j) EXPECT_EQ(ab[r * T + j].bits, 0);
}

}  // namespace
