// Kernel parity of the fused attention (attention_kernels.h): the KernelParity suite's fixture and
// tolerance rules are in tests/support/kernel_parity.h and tests/core/kernel_parity_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/attention_kernels.h"
#include "tests/support/kernel_parity.h"

// In stp::testing (not an anonymous namespace): the cases are members of the shared fixture.
namespace stp::testing {

using i64 = std::int64_t;

// ---- Fused attention (attention_kernels.h) ------------------------------------------------------------

// GQA (two query heads per k/v head), T = seq; packed rows as GPT-2 lays them out ([q | k | v], q =
// NH heads, k and v NKV heads). |q|, |k|, |v|, |do| <= 1. seq = 37: one full 32-row CPU tile and a
// ragged one, one CUDA block of 64 rows; seq = 150: 5 key tiles of 32, three CUDA blocks (64, 64,
// 22) per head in the forward and dq, and per k/v head in dk/dv.
constexpr i64 kFB = 2, kFNH = 4, kFNKV = 2, kFD = 8, kFQ = kFNH * kFD, kFKV = kFNKV * kFD, kFRow = kFQ + 2 * kFKV;

// The CUDA layout adds in the plain CPU functors' order over their 32-key tiles (bitwise but for
// nvcc's fused multiply-adds: FusedAttention.CudaLayoutEmulatedIsBitwiseThePlainCpuFunctors); the
// oracle on an AVX2 CPU is the vector path, which adds each tile's row sum in 8 lanes and fuses
// multiply-adds too: the two sides agree only within rounding. Each side is within the per-element
// float64 bounds derived in tests/core/fused_attention_test.cpp (for D <= 16, T <= 70; a longer T
// scales them by T / 70, as there), so the two are within twice those: o 1024 u; lse 1024 u *
// max(1, |lse|); dq 16384 u; dk 16384 u and dv 2048 u per unit of the column sum c_j of the softmax
// weights (computed below in float64 from the oracle's lse), each times max(1, T / 70). bf16 adds
// one bf16 ulp of the stored value (stored_as). The backward runs from the oracle's o and lse on
// both sides.
template <typename T>
void KernelParity::fused_attention_case(i64 seq) {
  const double grow = std::max(1.0, double(seq) / 70);
  const stp::AttentionLayout L{kFB, seq, kFNH, kFNKV, kFD, kFRow, kFRow, kFQ};
  const std::vector<T> qkv_host = values<T>(kFB * seq * kFRow, -1, 1);
  auto qkv = upload(qkv_host);
  auto o = upload(values<T>(kFB * seq * kFQ, -9, 9));
  auto lse = upload(uniform(kFB * kFNH * seq, -9, 9));
  run([&](Stream& s, Side at) {
    const T* q = at(qkv);
    stp::fused_attention_forward<T>(s, L, at(o), at(lse), q, q + kFQ, q + kFQ + kFKV);
  });
  const std::vector<float> lse_oracle = download(lse, 0);
  std::vector<double> lse_bound(lse_oracle.size());
  for (std::size_t i = 0; i < lse_bound.size(); ++i)
    lse_bound[i] = grow * 1024 * kU * std::max(1.0, std::fabs(double(lse_oracle[i])));
  expect_match("fused o", o, stored_as<T>(within(0, grow * 1024 * kU)));
  expect_match("fused lse", lse, per_element(lse_bound));

  // Column sums of the softmax weights per (b, k/v head, key), as the bounds of dk and dv need.
  const std::vector<float> qf = widened(qkv_host);
  const double scale = 1 / std::sqrt(double(kFD));
  std::vector<double> colsum(static_cast<std::size_t>(kFB * seq * kFNKV), 0.0);
  for (i64 b = 0; b < kFB; ++b)
    for (i64 h = 0; h < kFNH; ++h)
      for (i64 i = 0; i < seq; ++i)
        for (i64 j = 0; j <= i; ++j) {
          const i64 g = h / (kFNH / kFNKV);
          double s = 0;
          for (i64 d = 0; d < kFD; ++d)
            s += double(qf[(b * seq + i) * kFRow + h * kFD + d]) * qf[(b * seq + j) * kFRow + kFQ + g * kFD + d];
          colsum[(b * seq + j) * kFNKV + g] += std::exp(s * scale - lse_oracle[(b * kFNH + h) * seq + i]);
        }
  std::vector<double> dqkv_bound(qkv_host.size());
  for (i64 r = 0; r < kFB * seq; ++r)
    for (i64 c = 0; c < kFRow; ++c) {
      double b = grow * 16384 * kU;
      if (c >= kFQ) {
        const double cs = std::max(1.0, colsum[r * kFNKV + ((c - kFQ) % kFKV) / kFD]);
        b = grow * (c < kFQ + kFKV ? 16384 : 2048) * kU * cs;
      }
      dqkv_bound[r * kFRow + c] = b;
    }
  auto o_oracle = upload(download(o, 0));
  auto lse_both = upload(lse_oracle);
  auto dout = upload(values<T>(kFB * seq * kFQ, -1, 1));
  auto dqkv = upload(values<T>(kFB * seq * kFRow, -9, 9));
  auto delta = upload(uniform(static_cast<std::size_t>(stp::fused_attention_backward_workspace(L)), -9, 9));
  run([&](Stream& s, Side at) {
    const T* q = at(qkv);
    T* dq = at(dqkv);
    stp::fused_attention_backward<T>(s, L, dq, dq + kFQ, dq + kFQ + kFKV, at(delta), at(dout), q, q + kFQ,
                                     q + kFQ + kFKV, at(o_oracle), at(lse_both));
  });
  expect_match("fused dqkv", dqkv, stored_as<T>(per_element(dqkv_bound)));
}

TEST_P(KernelParity, FusedAttention) { fused_attention_case<float>(37); }
TEST_P(KernelParity, FusedAttentionBf16) { fused_attention_case<bf16>(37); }
TEST_P(KernelParity, FusedAttentionManyBlocks) { fused_attention_case<float>(150); }
TEST_P(KernelParity, FusedAttentionManyBlocksBf16) { fused_attention_case<bf16>(150); }

// ---- Library attention (Stream::library_attention_forward / _backward, core/device.h) -------------

// GQA (two query heads per k/v head) in packed rows, D = 64 (the library's head sizes are multiples
// of 8), T = 200: not a multiple of the engines' 64- and 128-row tiles. |q|, |k|, |v|, |do| <= 1.
constexpr i64 kLB = 2, kLT = 200, kLNH = 4, kLNKV = 2, kLD = 64, kLQ = kLNH * kLD, kLKV = kLNKV * kLD,
              kLRow = kLQ + 2 * kLKV;

// The oracle is stp's own fused kernel on the CPU; the device side is the stream's library
// (cuDNN's flash attention on CUDA). The library rounds to bf16 where stp's kernel keeps f32: the
// probabilities P before P V and P^T dO, dS before dS^T Q and dS K, and under GQA each query head's
// dK and dV before the sum over its group (docs/gpu-readiness.md, Attention). With ub = 2^-8 (bf16)
// and u = 2^-24, |scores| <= sqrt(D) = 8, |dP|, |do . o| <= D:
//   scores: a D-term f32 dot product on each side, |error| <= 2 * 64 * 8 u = 1024 u; lse adds the
//     f32 exp / sum / log over T keys, T u each side: lse within 4096 u * max(1, |lse|);
//   o_i = sum_j p_ij v_j: P rounded to bf16 (ub relative), p's error from the scores and lse
//     (<= 4096 u relative), the oracle's own 1024 u: 65536 u + 8192 u absolute, plus o's bf16 ulp;
//   dv_j = sum_i p_ij do_i: two bf16 roundings (P, GQA's per-head dV) of terms summing to c_j,
//     the column sum of the softmax weights: (2 * 65536 + 8192) u * max(1, c_j);
//   |ds_ij| <= p_ij (D + D) / sqrt(D) = 16 p_ij; dk_j = sum_i ds_ij q_i: dS and GQA's per-head dK
//     rounded to bf16, p's relative error on the rest: (2 * 16 * 65536 + 16 * 8192) u * max(1, c_j);
//   dq_i = sum_j ds_ij k_j with sum_j p_ij = 1: (16 * 65536 + 16 * 8192) u.
// Bitwise run to run: a second forward and backward must repeat every output byte (deterministic
// engines only).
template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void KernelParity::library_attention_case() {
  const AttentionShape shape{kLB, kLT, kLNH, kLNKV, kLD, kLRow, kLRow, kLQ, DType::Bf16};
  if (on_cpu()) {
    AttentionShape f32 = shape;
    f32.type = DType::F32;
    EXPECT_FALSE(stream_[1]->prepare_attention(shape));
    EXPECT_FALSE(stream_[1]->prepare_attention(f32));
    GTEST_SKIP() << "the CPU backend has no attention library (stp's own kernel runs: FusedAttention)";
  }
  // The workspace a trainer gives its compute stream.
  const std::size_t ws_bytes = stp::attention_workspace_bytes(GetParam());
  void* ws = dev_[1]->allocate(ws_bytes);
  owned_[1].push_back(ws);
  stream_[1]->set_attention_workspace(ws, ws_bytes);
  if (!stream_[1]->prepare_attention(shape))
    GTEST_SKIP() << "this device's stream offers no library attention for the shape (stderr says why: no usable "
                    "cuDNN, or the shape refused)";
  AttentionShape f32 = shape;
  f32.type = DType::F32;
  EXPECT_FALSE(stream_[1]->prepare_attention(f32)) << "the library path is bf16 only";

  const stp::AttentionLayout L{kLB, kLT, kLNH, kLNKV, kLD, kLRow, kLRow, kLQ};
  const std::vector<bf16> qkv_host = values<bf16>(kLB * kLT * kLRow, -1, 1);
  auto qkv = upload(qkv_host);
  auto o = upload(values<bf16>(kLB * kLT * kLQ, -9, 9));
  auto lse = upload(uniform(kLB * kLNH * kLT, -9, 9));
  auto forward = [&] {
    run([&](Stream& s, Side at) {
      const bf16* q = at(qkv);
      if (&s == stream_[0].get()) {
        stp::fused_attention_forward<bf16>(s, L, at(o), at(lse), q, q + kLQ, q + kLQ + kLKV);
        return;
      }
      ASSERT_TRUE(s.library_attention_forward({shape, q, q + kLQ, q + kLQ + kLKV, at(o), at(lse)}));
    });
  };
  forward();
  const std::vector<float> lse_oracle = download(lse, 0);
  std::vector<double> lse_bound(lse_oracle.size());
  for (std::size_t i = 0; i < lse_bound.size(); ++i)
    lse_bound[i] = 4096 * kU * std::max(1.0, std::fabs(double(lse_oracle[i])));
  expect_match("library o", o, stored_as<bf16>(within(0, (65536 + 8192) * kU)));
  expect_match("library lse", lse, per_element(lse_bound));
  const std::vector<bf16> o_first = download(o, 1);
  const std::vector<float> lse_first = download(lse, 1);
  forward();
  EXPECT_TRUE(same_bytes(o_first, download(o, 1))) << "the library's o differs between two runs";
  EXPECT_TRUE(same_bytes(lse_first, download(lse, 1))) << "the library's lse differs between two runs";

  const std::vector<float> qf = widened(qkv_host);
  const double scale = 1 / std::sqrt(double(kLD));
  std::vector<double> colsum(static_cast<std::size_t>(kLB * kLT * kLNKV), 0.0);
  for (i64 b = 0; b < kLB; ++b)
    for (i64 h = 0; h < kLNH; ++h)
      for (i64 i = 0; i < kLT; ++i)
        for (i64 j = 0; j <= i; ++j) {
          const i64 g = h / (kLNH / kLNKV);
          double s = 0;
          for (i64 d = 0; d < kLD; ++d)
            s += double(qf[(b * kLT + i) * kLRow + h * kLD + d]) * qf[(b * kLT + j) * kLRow + kLQ + g * kLD + d];
          colsum[(b * kLT + j) * kLNKV + g] += std::exp(s * scale - lse_oracle[(b * kLNH + h) * kLT + i]);
        }
  std::vector<double> dqkv_bound(qkv_host.size());
  for (i64 r = 0; r < kLB * kLT; ++r)
    for (i64 c = 0; c < kLRow; ++c) {
      double b = (16 * 65536 + 16 * 8192) * kU;
      if (c >= kLQ) {
        const double cs = std::max(1.0, colsum[r * kLNKV + ((c - kLQ) % kLKV) / kLD]);
        b = (c < kLQ + kLKV ? 2 * 16 * 65536 + 16 * 8192 : 2 * 65536 + 8192) * kU * cs;
      }
      dqkv_bound[r * kLRow + c] = b;
    }
  // Both sides run from the oracle's o and lse: the library's backward reads stp's lse record.
  auto o_oracle = upload(download(o, 0));
  auto lse_both = upload(lse_oracle);
  auto dout = upload(values<bf16>(kLB * kLT * kLQ, -1, 1));
  auto dqkv = upload(values<bf16>(kLB * kLT * kLRow, -9, 9));
  auto work = upload(uniform(static_cast<std::size_t>(stp::fused_attention_backward_workspace(L)), -9, 9));
  auto backward = [&] {
    run([&](Stream& s, Side at) {
      const bf16* q = at(qkv);
      bf16* dq = at(dqkv);
      if (&s == stream_[0].get()) {
        stp::fused_attention_backward<bf16>(s, L, dq, dq + kLQ, dq + kLQ + kLKV, at(work), at(dout), q, q + kLQ,
                                            q + kLQ + kLKV, at(o_oracle), at(lse_both));
        return;
      }
      ASSERT_TRUE(s.library_attention_backward({shape, q, q + kLQ, q + kLQ + kLKV, at(o_oracle), at(dout), at(lse_both),
                                                dq, dq + kLQ, dq + kLQ + kLKV, at(work)}));
    });
  };
  backward();
  expect_match("library dqkv", dqkv, stored_as<bf16>(per_element(dqkv_bound)));
  const std::vector<bf16> dqkv_first = download(dqkv, 1);
  backward();
  EXPECT_TRUE(same_bytes(dqkv_first, download(dqkv, 1))) << "the library's dq, dk, dv differ between two runs";
}

TEST_P(KernelParity, LibraryAttentionBf16) { library_attention_case(); }

}  // namespace stp::testing
