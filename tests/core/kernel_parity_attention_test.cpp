// Kernel parity of the fused attention (attention_kernels.h): the KernelParity suite's fixture and
// tolerance rules are in tests/support/kernel_parity.h and tests/core/kernel_parity_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/attention_kernels.h"
#include "tests/support/kernel_parity.h"

// In stp::testing (not an anonymous namespace): the cases are members of the shared fixture.
namespace stp::testing {

using i64 = std::int64_t;

// ---- Fused attention (attention_kernels.h) ------------------------------------------------------------

// GQA (two query heads per k/v head), T = 37: one full 32-row CPU tile and a ragged one; packed rows
// as GPT-2 lays them out ([q | k | v], q = NH heads, k and v NKV heads). |q|, |k|, |v|, |do| <= 1.
constexpr i64 kFB = 2, kFT = 37, kFNH = 4, kFNKV = 2, kFD = 8, kFQ = kFNH * kFD, kFKV = kFNKV * kFD,
              kFRow = kFQ + 2 * kFKV;

// The CPU runs 32-row tiles, the GPU one row per thread, so the online softmax rescales after
// different keys, and the GPU contracts products into FMAs: the two sides agree only within
// rounding. Each side is within the per-element float64 bounds derived in
// tests/core/fused_attention_test.cpp (for D <= 16, T <= 70; rescaling after every key instead of
// every tile adds up to T u = 37 u to the weights' relative error, inside their margin), so the two
// are within twice those: o 1024 u; lse 1024 u * max(1, |lse|); dq 16384 u; dk 16384 u and dv
// 2048 u per unit of the column sum c_j of the softmax weights (computed below in float64 from the
// oracle's lse). bf16 adds one bf16 ulp of the stored value (stored_as). The backward runs from the
// oracle's o and lse on both sides.
template <typename T>
void KernelParity::fused_attention_case() {
  const stp::AttentionLayout L{kFB, kFT, kFNH, kFNKV, kFD, kFRow, kFRow, kFQ};
  const std::vector<T> qkv_host = values<T>(kFB * kFT * kFRow, -1, 1);
  auto qkv = upload(qkv_host);
  auto o = upload(values<T>(kFB * kFT * kFQ, -9, 9));
  auto lse = upload(uniform(kFB * kFNH * kFT, -9, 9));
  run([&](Stream& s, Side at) {
    const T* q = at(qkv);
    stp::fused_attention_forward<T>(s, L, at(o), at(lse), q, q + kFQ, q + kFQ + kFKV);
  });
  const std::vector<float> lse_oracle = download(lse, 0);
  std::vector<double> lse_bound(lse_oracle.size());
  for (std::size_t i = 0; i < lse_bound.size(); ++i)
    lse_bound[i] = 1024 * kU * std::max(1.0, std::fabs(double(lse_oracle[i])));
  expect_match("fused o", o, stored_as<T>(within(0, 1024 * kU)));
  expect_match("fused lse", lse, per_element(lse_bound));

  // Column sums of the softmax weights per (b, k/v head, key), as the bounds of dk and dv need.
  const std::vector<float> qf = widened(qkv_host);
  const double scale = 1 / std::sqrt(double(kFD));
  std::vector<double> colsum(static_cast<std::size_t>(kFB * kFT * kFNKV), 0.0);
  for (i64 b = 0; b < kFB; ++b)
    for (i64 h = 0; h < kFNH; ++h)
      for (i64 i = 0; i < kFT; ++i)
        for (i64 j = 0; j <= i; ++j) {
          const i64 g = h / (kFNH / kFNKV);
          double s = 0;
          for (i64 d = 0; d < kFD; ++d)
            s += double(qf[(b * kFT + i) * kFRow + h * kFD + d]) * qf[(b * kFT + j) * kFRow + kFQ + g * kFD + d];
          colsum[(b * kFT + j) * kFNKV + g] += std::exp(s * scale - lse_oracle[(b * kFNH + h) * kFT + i]);
        }
  std::vector<double> dqkv_bound(qkv_host.size());
  for (i64 r = 0; r < kFB * kFT; ++r)
    for (i64 c = 0; c < kFRow; ++c) {
      double b = 16384 * kU;
      if (c >= kFQ) {
        const double cs = std::max(1.0, colsum[r * kFNKV + ((c - kFQ) % kFKV) / kFD]);
        b = (c < kFQ + kFKV ? 16384 : 2048) * kU * cs;
      }
      dqkv_bound[r * kFRow + c] = b;
    }
  auto o_oracle = upload(download(o, 0));
  auto lse_both = upload(lse_oracle);
  auto dout = upload(values<T>(kFB * kFT * kFQ, -1, 1));
  auto dqkv = upload(values<T>(kFB * kFT * kFRow, -9, 9));
  auto delta = upload(uniform(static_cast<std::size_t>(stp::fused_attention_backward_workspace(L)), -9, 9));
  run([&](Stream& s, Side at) {
    const T* q = at(qkv);
    T* dq = at(dqkv);
    stp::fused_attention_backward<T>(s, L, dq, dq + kFQ, dq + kFQ + kFKV, at(delta), at(dout), q, q + kFQ,
                                     q + kFQ + kFKV, at(o_oracle), at(lse_both));
  });
  expect_match("fused dqkv", dqkv, stored_as<T>(per_element(dqkv_bound)));
}

TEST_P(KernelParity, FusedAttention) { fused_attention_case<float>(); }
TEST_P(KernelParity, FusedAttentionBf16) { fused_attention_case<bf16>(); }

}  // namespace stp::testing
