// Fused causal attention (core/kernels/attention_kernels.h) against a float64 reference computed
// from the same stored inputs, and its determinism across runs and oneTBB thread counts.
//
// Tolerances (u = 2^-24, f32 unit roundoff; inputs q, k, v, do uniform in [-1, 1]; D = 16, T <= 70,
// so a query row sums at most T terms and a key column at most rep * T with rep <= 2 query heads
// per k/v head). Bounds per element, from the standard dot-product bound gamma_n = n u / (1 - n u)
// times the sum of the absolute terms (Higham, Accuracy and Stability of Numerical Algorithms,
// section 3.1), rounded up:
//   score s = (q . k) / sqrt(D): gamma_D * D (|q k| <= 1) / sqrt(D) + the scale's roundings
//     (|s| <= sqrt(D)): 64 u + 12 u = 76 u absolute.
//   softmax weight w = exp(s - lse): s and the running max each carry 76 u, expf < 1 ulp, each key
//     tile's rescale of the accumulator and the row sum (at most 3 tiles) a rounding, the row sum of
//     T terms gamma_T (70 u), the final division 1 u: <= 230 u relative.
//   o = sum_j w_j v_j: 230 u + gamma_T (70 u), times sum w |v| <= 1: 300 u -> 512 u absolute.
//   lse = max + log(sum): 76 u + 80 u (the sum) + 1 u + u |lse|: 512 u * max(1, |lse|).
//   dv_j = sum_i w_ij do_i: (230 u + gamma_{rep T} = 140 u) per unit of column sum c_j = sum_i w_ij
//     -> 1024 u * max(1, c_j).
//   dp = do . v: D^2 u = 256 u. delta = do . o: D * 300 u (o's error) + 256 u = 5056 u.
//     ds = w (dp - delta), |dp - delta| <= 2 D: w * (230 u * 32 + 256 u + 5056 u) = w * 12672 u.
//   dq_i = sum_j ds_ij k_j / sqrt(D): 12672 u / 4 (row sum of w = 1) + gamma_T * sum|ds| / 4
//     (sum_j |ds| <= 2 D) = 3168 u + 560 u -> 8192 u absolute.
//   dk_j = sum_i ds_ij q_i / sqrt(D): the same per unit of column sum: 8192 u * max(1, c_j).
// Longer rows (T > 70, the multi-block cases below): every gamma_T and tile-count term above grows
// at most linearly in T, so the bounds are scaled by T / 70 there.
// A wrong index, a missed tile or a mask off by one is off by O(0.1) (the test prints the largest
// error next to its bound).
// bf16 storage: inputs are bf16 (exact in the reference); each output is rounded once to bf16
// (relative 2^-8 of itself), and the backward reads the bf16-rounded o in delta: |delta error| <= D *
// 2^-8 (|do| <= 1, |o| <= 1), which reaches dq through ds as scale * D * 2^-8 = 2^-6 per unit of row
// sum and dk as 2^-6 * c_j. So bf16 bounds are the f32 bounds + 2^-8 |ref| + 2^-6 (dq) or
// 2^-6 * max(1, c_j) (dk); o and lse: + 2^-8 |ref| (lse is f32, from the f32 arithmetic: f32 bound).
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/cpu/cpu_device.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/attention_tiles.h"
#include "core/kernels/cpu_isa.h"
#include "core/launch_shape.h"

using namespace stp;

namespace {

using i64 = std::int64_t;
constexpr double kU = 1.0 / (1 << 24);
constexpr double kBf16 = 1.0 / 256;

struct Case {
  i64 B, T, NH, NKV, D;
};

// Separate q, k, v buffers with row strides wider than the heads (as GPT-2's packed rows are), so a
// stride or head-offset error reads the padding, which holds large values.
struct Problem {
  Case c;
  i64 ldq, ldkv, ldo;
  std::vector<double> q, k, v, dout;  // stored values, widened
  AttentionLayout layout() const { return {c.B, c.T, c.NH, c.NKV, c.D, ldq, ldkv, ldo}; }
};

Problem make_problem(const Case& c, unsigned seed, bool bf16_values) {
  Problem p{c, c.NH * c.D + 5, c.NKV * c.D + 3, c.NH * c.D + 7, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<double>& x, i64 rows, i64 ld, i64 width) {
    x.assign(static_cast<std::size_t>(rows * ld), 99.0);
    for (i64 r = 0; r < rows; ++r)
      for (i64 w = 0; w < width; ++w) {
        float f = u(rng);
        x[static_cast<std::size_t>(r * ld + w)] = bf16_values ? to_f32(from_f32<bf16>(f)) : f;
      }
  };
  fill(p.q, c.B * c.T, p.ldq, c.NH * c.D);
  fill(p.k, c.B * c.T, p.ldkv, c.NKV * c.D);
  fill(p.v, c.B * c.T, p.ldkv, c.NKV * c.D);
  fill(p.dout, c.B * c.T, p.ldo, c.NH * c.D);
  return p;
}

// float64 reference: o, lse, dq, dk, dv, and the column sums c_j of the softmax weights over every
// query row (of every head of the group) that sees key j.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv, colsum;
};

Reference reference(const Problem& p) {
  const Case& c = p.c;
  const i64 rep = c.NH / c.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  Reference r;
  r.o.assign(p.dout.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(c.B * c.NH * c.T), 0.0);
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.v.size(), 0.0);
  r.colsum.assign(p.k.size(), 0.0);
  auto Q = [&](i64 b, i64 t, i64 h) { return static_cast<std::size_t>((b * c.T + t) * p.ldq + h * c.D); };
  auto K = [&](i64 b, i64 t, i64 g) { return static_cast<std::size_t>((b * c.T + t) * p.ldkv + g * c.D); };
  auto O = [&](i64 b, i64 t, i64 h) { return static_cast<std::size_t>((b * c.T + t) * p.ldo + h * c.D); };
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.NH; ++h) {
      const i64 g = h / rep;
      for (i64 i = 0; i < c.T; ++i) {
        std::vector<double> s(static_cast<std::size_t>(i + 1)), w(s.size());
        double mx = -1e300;
        for (i64 j = 0; j <= i; ++j) {
          double acc = 0;
          for (i64 d = 0; d < c.D; ++d) acc += p.q[Q(b, i, h) + d] * p.k[K(b, j, g) + d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (i64 j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<std::size_t>((b * c.NH + h) * c.T + i)] = lse;
        for (i64 j = 0; j <= i; ++j) w[j] = std::exp(s[j] - lse);
        for (i64 d = 0; d < c.D; ++d) {
          double acc = 0;
          for (i64 j = 0; j <= i; ++j) acc += w[j] * p.v[K(b, j, g) + d];
          r.o[O(b, i, h) + d] = acc;
        }
        double delta = 0;
        for (i64 d = 0; d < c.D; ++d) delta += p.dout[O(b, i, h) + d] * r.o[O(b, i, h) + d];
        for (i64 j = 0; j <= i; ++j) {
          double dp = 0;
          for (i64 d = 0; d < c.D; ++d) dp += p.dout[O(b, i, h) + d] * p.v[K(b, j, g) + d];
          const double ds = w[j] * (dp - delta);
          for (i64 d = 0; d < c.D; ++d) {
            r.dv[K(b, j, g) + d] += w[j] * p.dout[O(b, i, h) + d];
            r.dq[Q(b, i, h) + d] += ds * p.k[K(b, j, g) + d] * scale;
            r.dk[K(b, j, g) + d] += ds * p.q[Q(b, i, h) + d] * scale;
            r.colsum[K(b, j, g) + d] += w[j];
          }
        }
      }
    }
  return r;
}

template <typename T>
struct Buffers {
  std::vector<T> q, k, v, dout, o, dq, dk, dv;
  std::vector<float> lse, delta;
};

template <typename T>
std::vector<T> stored(const std::vector<double>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_f32<T>(static_cast<float>(x[i]));
  return out;
}

// Runs forward and backward on a CPU device (device memory of the CPU backend is host memory).
// Outputs start as NaN-free garbage (77), so an element the kernels never write fails.
template <typename T>
Buffers<T> run(const Problem& p) {
  auto devs = make_cpu_devices(1);
  auto s = devs[0]->create_stream("compute");
  Buffers<T> h{stored<T>(p.q), stored<T>(p.k), stored<T>(p.v), stored<T>(p.dout), {}, {}, {}, {}, {}, {}};
  h.o = std::vector<T>(p.dout.size(), from_f32<T>(77.0f));
  h.dq = std::vector<T>(p.q.size(), from_f32<T>(77.0f));
  h.dk = std::vector<T>(p.k.size(), from_f32<T>(77.0f));
  h.dv = std::vector<T>(p.v.size(), from_f32<T>(77.0f));
  h.lse.assign(static_cast<std::size_t>(p.c.B * p.c.NH * p.c.T), 77.0f);
  const AttentionLayout L = p.layout();
  h.delta.assign(static_cast<std::size_t>(fused_attention_backward_workspace(L)), 77.0f);
  fused_attention_forward<T>(*s, L, h.o.data(), h.lse.data(), h.q.data(), h.k.data(), h.v.data());
  fused_attention_backward<T>(*s, L, h.dq.data(), h.dk.data(), h.dv.data(), h.delta.data(), h.dout.data(), h.q.data(),
                              h.k.data(), h.v.data(), h.o.data(), h.lse.data());
  s->synchronize();
  return h;
}

// Compares the head columns of every row: |got - ref| <= bound(i) per element; padding untouched.
template <typename T, typename Bound>
void expect_close(const char* what, const std::vector<T>& got, const std::vector<double>& ref, i64 rows, i64 ld,
                  i64 width, Bound bound) {
  double worst = 0, worst_bound = 0;
  int bad = 0;
  for (i64 r = 0; r < rows; ++r)
    for (i64 w = 0; w < width; ++w) {
      const std::size_t i = static_cast<std::size_t>(r * ld + w);
      const double err = std::fabs(static_cast<double>(to_f32(got[i])) - ref[i]), b = bound(i);
      if (err / b > (worst_bound > 0 ? worst / worst_bound : 0)) worst = err, worst_bound = b;
      if (!(err <= b) && bad++ < 5)
        ADD_FAILURE() << what << "[" << r << "," << w << "] = " << to_f32(got[i]) << ", reference " << ref[i]
                      << ", bound " << b;
    }
  std::printf("[ fused attention ] %-4s largest error %.2e (bound there %.2e)\n", what, worst, worst_bound);
}

template <typename T>
void check_case(const Case& c, unsigned seed) {
  constexpr bool bf = std::is_same_v<T, bf16>;
  const Problem p = make_problem(c, seed, bf);
  const Reference r = reference(p);
  const Buffers<T> h = run<T>(p);
  const i64 rows = c.B * c.T;
  const double rel = bf ? kBf16 : 0.0, grad_delta = bf ? 4 * kBf16 : 0.0;
  const double u = kU * std::max(1.0, static_cast<double>(c.T) / 70.0);  // see the header: longer rows
  expect_close("o", h.o, r.o, rows, p.ldo, c.NH * c.D,
               [&](std::size_t i) { return 512 * u + rel * std::fabs(r.o[i]); });
  expect_close("lse", h.lse, r.lse, 1, 0, static_cast<i64>(r.lse.size()),
               [&](std::size_t i) { return 512 * u * std::max(1.0, std::fabs(r.lse[i])); });
  expect_close("dq", h.dq, r.dq, rows, p.ldq, c.NH * c.D,
               [&](std::size_t i) { return 8192 * u + rel * std::fabs(r.dq[i]) + grad_delta; });
  expect_close("dk", h.dk, r.dk, rows, p.ldkv, c.NKV * c.D, [&](std::size_t i) {
    return (8192 * u + grad_delta) * std::max(1.0, r.colsum[i]) + rel * std::fabs(r.dk[i]);
  });
  expect_close("dv", h.dv, r.dv, rows, p.ldkv, c.NKV * c.D,
               [&](std::size_t i) { return 1024 * u * std::max(1.0, r.colsum[i]) + rel * std::fabs(r.dv[i]); });
  // Padding between rows is never written.
  for (std::size_t i = 0; i < h.dq.size(); ++i) {
    if (static_cast<i64>(i) % p.ldq >= c.NH * c.D) {
      ASSERT_EQ(to_f32(h.dq[i]), 77.0f) << "dq padding written at " << i;
    }
  }
  for (std::size_t i = 0; i < h.o.size(); ++i) {
    if (static_cast<i64>(i) % p.ldo >= c.NH * c.D) {
      ASSERT_EQ(to_f32(h.o[i]), 77.0f) << "o padding written at " << i;
    }
  }
}

// T = 70 is not a multiple of the 32-row tile (tiles of 32, 32, 6); T = 32 and 33 put the causal
// diagonal exactly on, and one row past, a tile edge; T = 1 has one key per row.
const Case kCases[] = {
    {2, 70, 4, 4, 16},  // multi-head, ragged last tile
    {2, 70, 4, 2, 16},  // GQA: two query heads per k/v head
    {1, 33, 4, 1, 16},  // multi-query: every head shares one k/v head
    {3, 32, 2, 2, 16},  // T exactly one tile
    {2, 1, 2, 1, 16},   // T = 1
    {1, 45, 2, 2, 12},  // D not a multiple of the 8-lane dot product
    // The CPU path's larger blocks (attention_kernels.cpp: 128 query rows per forward task, 128
    // keys per backward step): T = 129 is one row past a block edge, T = 300 three blocks
    // (128, 128, 44) with GQA.
    {1, 129, 2, 2, 16},
    {1, 300, 4, 2, 16},
};

// check_case for every case of kCases, with the seeds first_seed, first_seed + 1, ...
template <typename T>
void check_every_case(unsigned first_seed) {
  unsigned seed = first_seed;
  for (const Case& c : kCases) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " NH " + std::to_string(c.NH) + " NKV " +
                 std::to_string(c.NKV) + " D " + std::to_string(c.D));
    check_case<T>(c, seed++);
  }
}

TEST(FusedAttention, F32MatchesFloat64Reference) { check_every_case<float>(1); }

TEST(FusedAttention, Bf16MatchesFloat64ReferenceWithinBf16Rounding) { check_every_case<bf16>(101); }

// Every output bitwise equal across repeated runs and with oneTBB limited to 1 or 2 threads: each
// element is written by one task that sums in a fixed order (attention_kernels.h, Work split).
template <typename T>
void expect_deterministic() {
  const Problem p = make_problem({2, 300, 4, 2, 32}, 7, std::is_same_v<T, bf16>);  // several blocks per task
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  Buffers<T> first;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    first = run<T>(p);
  }
  for (int threads : {2, 1, 2}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    const Buffers<T> h = run<T>(p);
    EXPECT_TRUE(same(h.o, first.o)) << "o, threads " << threads;
    EXPECT_TRUE(same(h.lse, first.lse)) << "lse, threads " << threads;
    EXPECT_TRUE(same(h.dq, first.dq)) << "dq, threads " << threads;
    EXPECT_TRUE(same(h.dk, first.dk)) << "dk, threads " << threads;
    EXPECT_TRUE(same(h.dv, first.dv)) << "dv, threads " << threads;
  }
}

TEST(FusedAttention, BitwiseDeterministicAcrossRunsAndThreadCounts) {
  expect_deterministic<float>();
  expect_deterministic<bf16>();
}

// The vector path's AVX-512 tile products (16 lanes, 4 x 32 blocks) against its AVX2 ones (8 lanes,
// 4 x 16): every element is the same multiply-add chain, so every output is bitwise equal. D = 32
// runs the 32-column blocks, D = 16 the 16-column remainder.
template <typename T>
void expect_avx512_same_as_avx2(const Case& c) {
  const Problem p = make_problem(c, 11, std::is_same_v<T, bf16>);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  attention_detail::simd_attention_allow_avx512(false);
  const Buffers<T> narrow = run<T>(p);
  attention_detail::simd_attention_allow_avx512(true);
  const Buffers<T> wide = run<T>(p);
  EXPECT_TRUE(same(wide.o, narrow.o)) << "o";
  EXPECT_TRUE(same(wide.lse, narrow.lse)) << "lse";
  EXPECT_TRUE(same(wide.dq, narrow.dq)) << "dq";
  EXPECT_TRUE(same(wide.dk, narrow.dk)) << "dk";
  EXPECT_TRUE(same(wide.dv, narrow.dv)) << "dv";
}

TEST(FusedAttention, Avx512TileProductsAreBitwiseTheAvx2Ones) {
#if defined(STP_ATTENTION_SIMD_BUILT)
  if (!attention_detail::simd_attention_available() || !cpu_has_isa(CpuIsa::Avx512))
    GTEST_SKIP() << "this CPU (or STP_CPU_ISA) allows one of the two forms only";
  for (const Case& c : {Case{2, 300, 4, 2, 32}, Case{1, 129, 2, 2, 16}, Case{1, 45, 2, 2, 12}}) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " D " + std::to_string(c.D));
    expect_avx512_same_as_avx2<float>(c);
    expect_avx512_same_as_avx2<bf16>(c);
  }
#else
  GTEST_SKIP() << "no vector path in this build";
#endif
}

// The CUDA layout (RowBlock blocks of kRowBlockThreads threads, k/v and q/do tiles staged in
// block-shared memory; attention_kernels.cpp), emulated on this CPU stream thread by thread and phase
// by phase, against the plain CPU functors (tiles of kCpuAttentionTile rows; the vector path turned
// off): every output and the untouched padding bitwise equal. The emulation runs the GPU's
// expressions in the GPU's order, so on a GPU only nvcc's fused multiply-adds can differ. Cases: GQA
// and multi-query, T not a multiple of the 32-row tile nor of the 64-row block (37, 100, 130), T = 1,
// D from 8 to kMaxAttentionHeadDim, and D = 12 (no power of two).
template <typename T>
void expect_cuda_layout_same_as_plain(const Case& c, unsigned seed) {
  const Problem p = make_problem(c, seed, std::is_same_v<T, bf16>);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  const Buffers<T> plain = run<T>(p);
  Buffers<T> blocks;
  {
    EmulatedRowBlocks emulate;
    blocks = run<T>(p);
  }
  EXPECT_TRUE(same(blocks.o, plain.o)) << "o";
  EXPECT_TRUE(same(blocks.lse, plain.lse)) << "lse";
  EXPECT_TRUE(same(blocks.dq, plain.dq)) << "dq";
  EXPECT_TRUE(same(blocks.dk, plain.dk)) << "dk";
  EXPECT_TRUE(same(blocks.dv, plain.dv)) << "dv";
}

// Turns the CPU vector path off while it lives (where the build has one), so that a CPU stream runs
// the plain functors.
struct PlainFunctorsOnly {
#if defined(STP_ATTENTION_SIMD_BUILT)
  PlainFunctorsOnly() { attention_detail::simd_attention_allow(false); }
  ~PlainFunctorsOnly() { attention_detail::simd_attention_allow(true); }
#endif
};

TEST(FusedAttention, CudaLayoutEmulatedIsBitwiseThePlainCpuFunctors) {
  static_assert(kRowBlockThreads % kCpuAttentionTile == 0, "a block holds whole 32-row tiles");
  PlainFunctorsOnly plain;
  unsigned seed = 31;
  for (const Case& c : {Case{2, 37, 4, 2, 8}, Case{1, 100, 4, 2, 64}, Case{1, 130, 2, 1, kMaxAttentionHeadDim},
                        Case{1, 64, 2, 2, 12}, Case{2, 1, 2, 1, 16}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " NH " + std::to_string(c.NH) + " NKV " +
                 std::to_string(c.NKV) + " D " + std::to_string(c.D));
    expect_cuda_layout_same_as_plain<float>(c, seed++);
    expect_cuda_layout_same_as_plain<bf16>(c, seed++);
  }
}

// The emulated CUDA layout against the float64 reference, every case of kCases (the vector path,
// where the CPU has one, is the one F32MatchesFloat64Reference checks).
TEST(FusedAttention, CudaLayoutEmulatedMatchesFloat64Reference) {
  EmulatedRowBlocks emulate;
  check_every_case<float>(201);
  check_every_case<bf16>(301);
}

TEST(FusedAttention, RejectsHeadDimensionAboveTheLimitAndUnevenGroups) {
  auto devs = make_cpu_devices(1);
  auto s = devs[0]->create_stream("compute");
  std::vector<float> buf(1 << 12), lse(64);
  const i64 D = kMaxAttentionHeadDim + 1;
  AttentionLayout big{1, 2, 1, 1, D, D, D, D};
  EXPECT_THROW(fused_attention_forward<float>(*s, big, buf.data(), lse.data(), buf.data(), buf.data(), buf.data()),
               stp::Error);
  AttentionLayout uneven{1, 2, 3, 2, 4, 12, 8, 12};
  EXPECT_THROW(fused_attention_forward<float>(*s, uneven, buf.data(), lse.data(), buf.data(), buf.data(), buf.data()),
               stp::Error);
  s->synchronize();
}

}  // namespace
