// Internal to the fused attention kernels: what the plain functors (attention_kernels.cpp, single
// source for CPU and CUDA) and the CPU vector path (attention_kernels_avx2.cpp, GCC x86-64 host
// code) share. The exponential, the offsets of heads and query tiles, the two tile walks (the key
// tiles a query tile sees, the query tiles a key tile is seen by) and the write-outs of o and lse,
// dk and dv, and dq: both paths visit tiles, and so add, in the one order fixed here, and round
// each output by the one expression here. Contract of the kernels:
// attention_kernels.h.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/exp_nonpositive.h"

namespace stp::attention_detail {

using i64 = std::int64_t;
using usize = std::size_t;
constexpr i64 kMaxD = kMaxAttentionHeadDim;

// A score below every real one: the running max before the first key. Finite, so exp(m_old -
// m_new) is 0 rather than NaN.
constexpr float kNoScore = -3.0e38f;

STP_HD inline i64 min_i64(i64 a, i64 b) { return a < b ? a : b; }

// Element offsets of row 0 of (batch b, query head h), of its k/v head, and of its output head.
struct HeadPtrs {
  i64 q, kv, o;
};
STP_HD inline HeadPtrs head_offsets(const AttentionLayout& L, i64 b, i64 h) {
  const i64 g = h / (L.NH / L.NKV);
  return {b * L.T * L.ldq + h * L.D, b * L.T * L.ldkv + g * L.D, b * L.T * L.ldo + h * L.D};
}

// The query tile a (batch, head, query tile) task works on: task = (b · NH + h) · tiles + tile.
struct QueryTile {
  HeadPtrs ptrs;
  i64 bh;      // b · NH + h: the (batch, head) row block of lse and delta, (B, NH, T)
  i64 i0, ni;  // first row and row count (the last tile may be short)
};
template <int BQ>
STP_HD inline QueryTile query_tile(const AttentionLayout& L, usize task) {
  const i64 nqt = (L.T + BQ - 1) / BQ;
  const i64 qt_index = static_cast<i64>(task) % nqt, bh = static_cast<i64>(task) / nqt;
  const i64 i0 = qt_index * BQ;
  return {head_offsets(L, bh / L.NH, bh % L.NH), bh, i0, min_i64(BQ, L.T - i0)};
}

// The key tiles of K keys that query rows [i0, i0 + ni) see (causal: none after the last row), in
// order: f(j0, nj) with nj the tile's key count (the last tile may be short).
template <i64 K, typename F>
STP_HD inline void for_each_key_tile(i64 i0, i64 ni, F&& f) {
  const i64 last_key = i0 + ni - 1;
  for (i64 j0 = 0; j0 <= last_key; j0 += K) f(j0, min_i64(K, last_key + 1 - j0));
}

// The query tiles of R rows that see keys from j0 on, for k/v head g of batch b: the group's query
// heads in order, each over its tiles from the diagonal on, in order: f(hh, bh, P, i0, ni) with hh
// the head's index in the group, bh = b · NH + h, P its offsets, i0 and ni the tile's rows.
template <i64 R, typename F>
STP_HD inline void for_each_query_tile(const AttentionLayout& L, i64 b, i64 g, i64 j0, F&& f) {
  const i64 rep = L.NH / L.NKV;
  for (i64 hh = 0; hh < rep; ++hh) {
    const i64 h = g * rep + hh;
    const HeadPtrs P = head_offsets(L, b, h);
    for (i64 i0 = j0 / R * R; i0 < L.T; i0 += R) f(hh, b * L.NH + h, P, i0, min_i64(R, L.T - i0));
  }
}

// The end of a forward task, the online softmax's finish: for the query rows of Q, o = acc / l
// rounded once and lse = m + log l, from the task's f32 accumulators (element (i, d) of the tile
// at acc[i * si + d * sd]) and its per-row running max m and sum l.
template <typename T>
STP_HD inline void write_query_rows(const AttentionLayout& L, const QueryTile& Q, T* o, float* lse, const float* acc,
                                    i64 si, i64 sd, const float* m, const float* l) {
  for (i64 i = 0; i < Q.ni; ++i) {
    const float inv = 1.0f / l[i];
    T* orow = o + Q.ptrs.o + (Q.i0 + i) * L.ldo;
    for (i64 d = 0; d < L.D; ++d) orow[d] = from_f32<T>(acc[i * si + d * sd] * inv);
    lse[Q.bh * L.T + Q.i0 + i] = m[i] + logf(l[i]);
  }
}

// The end of a backward key tile: its keys' rows [j0, j0 + nj) of dk (times scale) and dv, each
// rounded once, for the k/v head whose row 0 is at kv_off, from the f32 accumulators (element
// (j, d) at dk_acc[j * sj + d * sd], dv_acc likewise).
template <typename T>
STP_HD inline void write_kv_rows(const AttentionLayout& L, T* dk, T* dv, i64 kv_off, i64 j0, i64 nj,
                                 const float* dk_acc, const float* dv_acc, i64 sj, i64 sd, float scale) {
  for (i64 j = 0; j < nj; ++j) {
    T* dkrow = dk + kv_off + (j0 + j) * L.ldkv;
    T* dvrow = dv + kv_off + (j0 + j) * L.ldkv;
    for (i64 d = 0; d < L.D; ++d) {
      dkrow[d] = from_f32<T>(dk_acc[j * sj + d * sd] * scale);
      dvrow[d] = from_f32<T>(dv_acc[j * sj + d * sd]);
    }
  }
}

// The CPU one-pass backward's f32 dq accumulators of (b, k/v head g), zeroed: the group's heads are
// adjacent, (rep, T, D) from row (b · NH + g · rep) · T of dqacc.
STP_HD inline float* group_dq_accumulators(const AttentionLayout& L, float* dqacc, i64 b, i64 g) {
  const i64 rep = L.NH / L.NKV;
  float* acc = dqacc + (b * L.NH + g * rep) * L.T * L.D;
  for (i64 x = 0; x < rep * L.T * L.D; ++x) acc[x] = 0.0f;
  return acc;
}

// One dq row (D elements) = its f32 accumulator * scale, rounded once.
template <typename T>
STP_HD inline void write_dq_row(T* row, const float* acc, i64 D, float scale) {
  for (i64 d = 0; d < D; ++d) row[d] = from_f32<T>(acc[d] * scale);
}

// dq rows of (b, k/v head g) = its accumulators (group_dq_accumulators) * scale, rounded once.
template <typename T>
STP_HD inline void write_group_dq(const AttentionLayout& L, const float* acc, T* dq, i64 b, i64 g, float scale) {
  const i64 rep = L.NH / L.NKV;
  for (i64 hh = 0; hh < rep; ++hh) {
    const HeadPtrs P = head_offsets(L, b, g * rep + hh);
    for (i64 t = 0; t < L.T; ++t) write_dq_row(dq + P.q + t * L.ldq, acc + (hh * L.T + t) * L.D, L.D, scale);
  }
}

// The CPU vector path (attention_kernels_avx2.cpp): GCC host builds on x86-64, on CPUs with AVX2 +
// FMA. The dispatch in attention_kernels.cpp is host code in every build (nvcc's host pass too):
// a CPU stream of an nvcc build takes the vector path as well.
// simd_attention_allow (tests) turns the vector path off, so that a CPU stream runs the plain
// functors of attention_kernels.cpp: the oracle of the CUDA layout's emulation.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STP_ATTENTION_SIMD_BUILT 1
// cpu_has_isa(CpuIsa::Avx2) (core/kernels/cpu_isa.h): the CPU has AVX2 and FMA, and STP_CPU_ISA allows them.
bool simd_attention_available();
// Whether a CPU stream may take the vector path at all (default true; simd_attention_available() is
// false while it is off).
void simd_attention_allow(bool allow);
// Whether the vector path's tile products may take their 16-wide AVX-512 form on CPUs that have
// AVX-512F (default true). The results are bitwise those of the 8-wide form either way; tests turn
// it off to check that.
void simd_attention_allow_avx512(bool allow);
// fused_attention_forward's CPU stream work, scale = 1 / sqrt(D).
template <typename T>
void simd_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k, const T* v,
                            float scale);
// fused_attention_backward's CPU stream work after delta: dqacc (B, NH, T, D) f32 accumulators.
template <typename T>
void simd_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* dqacc, const T* dout,
                             const T* q, const T* k, const T* v, const float* lse, const float* delta, float scale);
#endif

}  // namespace stp::attention_detail
