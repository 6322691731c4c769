// Fused causal attention (contract in attention_kernels.h). The functors are templates on the tile
// sizes: the CPU launch uses kCpuAttentionTile rows per tile, the CUDA launch one row per thread;
// the arithmetic of one (query row, key) pair is the same code in both.
#include "core/kernels/attention_kernels.h"

#include <cmath>

#include "base/error.h"
#include "core/launch.h"

namespace stp {
namespace {

using i64 = std::int64_t;
using usize = std::size_t;
constexpr i64 kMaxD = kMaxAttentionHeadDim;

// A score below every real one: the running max before the first key. Finite, so exp(m_old -
// m_new) is 0 rather than NaN.
constexpr float kNoScore = -3.0e38f;

STP_HD inline i64 min_i64(i64 a, i64 b) { return a < b ? a : b; }

// a . b over n elements in eight interleaved partial sums combined in a fixed tree: a fixed
// order (deterministic) that the compiler can keep in vector registers.
STP_HD inline float dot(const float* a, const float* b, i64 n) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  i64 d = 0;
  for (; d + 8 <= n; d += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[d + l] * b[d + l];
  for (; d < n; ++d) acc[0] += a[d] * b[d];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y = y * beta + a * x (element-wise, so any vectorisation keeps each element's order).
STP_HD inline void scale_axpy(float* y, float beta, float a, const float* x, i64 n) {
  for (i64 d = 0; d < n; ++d) y[d] = y[d] * beta + a * x[d];
}
STP_HD inline void axpy(float* y, float a, const float* x, i64 n) {
  for (i64 d = 0; d < n; ++d) y[d] += a * x[d];
}

// Widens rows [r0, r0 + nr) of a (row stride ld, D wide) into dst (stride D).
template <typename T>
STP_HD inline void load_rows(float* dst, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 r = 0; r < nr; ++r)
    for (i64 d = 0; d < D; ++d) dst[r * D + d] = to_f32(src[(r0 + r) * ld + d]);
}

// The head-local base pointers of one (batch, head): row t of the head is at base + t * ld.
struct HeadPtrs {
  i64 q, kv, o;  // element offsets of (b, 0) of the query head, of its k/v head, of the output head
};
STP_HD inline HeadPtrs head_offsets(const AttentionLayout& L, i64 b, i64 h) {
  const i64 g = h / (L.NH / L.NKV);
  return {b * L.T * L.ldq + h * L.D, b * L.T * L.ldkv + g * L.D, b * L.T * L.ldo + h * L.D};
}

// ---- Forward: one task per (b, h, query tile) ----------------------------------------------------

template <typename T, int BQ, int BK>
struct FusedForward {
  AttentionLayout L;
  T* o;
  float* lse;
  const T* q;
  const T* k;
  const T* v;
  float scale;
  STP_HD void operator()(usize task) const {
    const i64 D = L.D, nqt = (L.T + BQ - 1) / BQ;
    const i64 qt = static_cast<i64>(task) % nqt, bh = static_cast<i64>(task) / nqt;
    const i64 h = bh % L.NH, b = bh / L.NH;
    const HeadPtrs P = head_offsets(L, b, h);
    const i64 i0 = qt * BQ, ni = min_i64(BQ, L.T - i0);
    float qf[BQ * kMaxD], acc[BQ * kMaxD], kf[BK * kMaxD], vf[BK * kMaxD], srow[BK], m[BQ], l[BQ];
    load_rows(qf, q + P.q, L.ldq, i0, ni, D);
    for (i64 i = 0; i < ni; ++i) {
      m[i] = kNoScore;
      l[i] = 0.0f;
      for (i64 d = 0; d < D; ++d) acc[i * D + d] = 0.0f;
    }
    const i64 last_key = i0 + ni - 1;  // causal: no key after the tile's last query row
    for (i64 j0 = 0; j0 <= last_key; j0 += BK) {
      const i64 nj = min_i64(BK, last_key + 1 - j0);
      load_rows(kf, k + P.kv, L.ldkv, j0, nj, D);
      load_rows(vf, v + P.kv, L.ldkv, j0, nj, D);
      for (i64 i = 0; i < ni; ++i) {
        const i64 nv = min_i64(nj, i0 + i - j0 + 1);  // keys j0 .. i of this tile
        if (nv <= 0) continue;
        float mt = kNoScore;
        for (i64 j = 0; j < nv; ++j) {
          srow[j] = dot(qf + i * D, kf + j * D, D) * scale;
          mt = srow[j] > mt ? srow[j] : mt;
        }
        const float m_new = mt > m[i] ? mt : m[i];
        const float alpha = expf(m[i] - m_new);
        float sum = 0.0f;
        float* a = acc + i * D;
        for (i64 j = 0; j < nv; ++j) {
          const float p = expf(srow[j] - m_new);
          sum += p;
          if (j == 0)
            scale_axpy(a, alpha, p, vf, D);
          else
            axpy(a, p, vf + j * D, D);
        }
        l[i] = l[i] * alpha + sum;
        m[i] = m_new;
      }
    }
    for (i64 i = 0; i < ni; ++i) {
      const float inv = 1.0f / l[i];
      T* orow = o + P.o + (i0 + i) * L.ldo;
      for (i64 d = 0; d < D; ++d) orow[d] = from_f32<T>(acc[i * D + d] * inv);
      lse[bh * L.T + i0 + i] = m[i] + logf(l[i]);
    }
  }
};

// ---- Backward ---------------------------------------------------------------------------------------

// delta[(b, h, t)] = do . o of one query row (both as stored).
template <typename T>
struct FusedDelta {
  AttentionLayout L;
  float* delta;
  const T* dout;
  const T* o;
  STP_HD void operator()(usize r) const {
    const i64 t = static_cast<i64>(r) % L.T, bh = static_cast<i64>(r) / L.T;
    const i64 h = bh % L.NH, b = bh / L.NH;
    const i64 off = (b * L.T + t) * L.ldo + h * L.D;
    float acc = 0.0f;
    for (i64 d = 0; d < L.D; ++d) acc += to_f32(dout[off + d]) * to_f32(o[off + d]);
    delta[r] = acc;
  }
};

// dk, dv of one (b, k/v head g, key tile): the group's query heads in order, each over its query
// tiles from the diagonal on, in order.
template <typename T, int BQ, int BK>
struct FusedBackwardKV {
  AttentionLayout L;
  T* dk;
  T* dv;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const float* lse;
  const float* delta;
  float scale;
  STP_HD void operator()(usize task) const {
    const i64 D = L.D, nkt = (L.T + BK - 1) / BK, rep = L.NH / L.NKV;
    const i64 kt = static_cast<i64>(task) % nkt, bg = static_cast<i64>(task) / nkt;
    const i64 g = bg % L.NKV, b = bg / L.NKV;
    const i64 j0 = kt * BK, nj = min_i64(BK, L.T - j0);
    float kf[BK * kMaxD], vf[BK * kMaxD], dkf[BK * kMaxD], dvf[BK * kMaxD], qf[BQ * kMaxD], dof[BQ * kMaxD];
    const i64 kv_off = b * L.T * L.ldkv + g * L.D;
    load_rows(kf, k + kv_off, L.ldkv, j0, nj, D);
    load_rows(vf, v + kv_off, L.ldkv, j0, nj, D);
    for (i64 x = 0; x < nj * D; ++x) dkf[x] = dvf[x] = 0.0f;
    for (i64 hh = 0; hh < rep; ++hh) {
      const i64 h = g * rep + hh, bh = b * L.NH + h;
      const HeadPtrs P = head_offsets(L, b, h);
      for (i64 i0 = (j0 / BQ) * BQ; i0 < L.T; i0 += BQ) {
        const i64 ni = min_i64(BQ, L.T - i0);
        load_rows(qf, q + P.q, L.ldq, i0, ni, D);
        load_rows(dof, dout + P.o, L.ldo, i0, ni, D);
        for (i64 i = 0; i < ni; ++i) {
          const i64 nv = min_i64(nj, i0 + i - j0 + 1);
          if (nv <= 0) continue;
          const float z = lse[bh * L.T + i0 + i], dl = delta[bh * L.T + i0 + i];
          for (i64 j = 0; j < nv; ++j) {
            const float p = expf(dot(qf + i * D, kf + j * D, D) * scale - z);
            const float ds = p * (dot(dof + i * D, vf + j * D, D) - dl);
            axpy(dvf + j * D, p, dof + i * D, D);
            axpy(dkf + j * D, ds, qf + i * D, D);
          }
        }
      }
    }
    for (i64 j = 0; j < nj; ++j) {
      T* dkrow = dk + kv_off + (j0 + j) * L.ldkv;
      T* dvrow = dv + kv_off + (j0 + j) * L.ldkv;
      for (i64 d = 0; d < D; ++d) {
        dkrow[d] = from_f32<T>(dkf[j * D + d] * scale);
        dvrow[d] = from_f32<T>(dvf[j * D + d]);
      }
    }
  }
};

// dq of one (b, h, query tile): the key tiles up to the diagonal, in order.
template <typename T, int BQ, int BK>
struct FusedBackwardQ {
  AttentionLayout L;
  T* dq;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const float* lse;
  const float* delta;
  float scale;
  STP_HD void operator()(usize task) const {
    const i64 D = L.D, nqt = (L.T + BQ - 1) / BQ;
    const i64 qt = static_cast<i64>(task) % nqt, bh = static_cast<i64>(task) / nqt;
    const i64 h = bh % L.NH, b = bh / L.NH;
    const HeadPtrs P = head_offsets(L, b, h);
    const i64 i0 = qt * BQ, ni = min_i64(BQ, L.T - i0);
    float qf[BQ * kMaxD], dof[BQ * kMaxD], dqf[BQ * kMaxD], kf[BK * kMaxD], vf[BK * kMaxD];
    load_rows(qf, q + P.q, L.ldq, i0, ni, D);
    load_rows(dof, dout + P.o, L.ldo, i0, ni, D);
    for (i64 x = 0; x < ni * D; ++x) dqf[x] = 0.0f;
    const i64 last_key = i0 + ni - 1;
    for (i64 j0 = 0; j0 <= last_key; j0 += BK) {
      const i64 nj = min_i64(BK, last_key + 1 - j0);
      load_rows(kf, k + P.kv, L.ldkv, j0, nj, D);
      load_rows(vf, v + P.kv, L.ldkv, j0, nj, D);
      for (i64 i = 0; i < ni; ++i) {
        const i64 nv = min_i64(nj, i0 + i - j0 + 1);
        if (nv <= 0) continue;
        const float z = lse[bh * L.T + i0 + i], dl = delta[bh * L.T + i0 + i];
        for (i64 j = 0; j < nv; ++j) {
          const float p = expf(dot(qf + i * D, kf + j * D, D) * scale - z);
          const float ds = p * (dot(dof + i * D, vf + j * D, D) - dl);
          axpy(dqf + i * D, ds, kf + j * D, D);
        }
      }
    }
    for (i64 i = 0; i < ni; ++i) {
      T* row = dq + P.q + (i0 + i) * L.ldq;
      for (i64 d = 0; d < D; ++d) row[d] = from_f32<T>(dqf[i * D + d] * scale);
    }
  }
};

void check_layout(const AttentionLayout& L) {
  STP_CHECK(L.D >= 1 && L.D <= kMaxAttentionHeadDim, "fused attention: head dimension ", L.D, " is outside [1, ",
            kMaxAttentionHeadDim, "]; use model.attention: naive");
  STP_CHECK(L.NKV >= 1 && L.NH % L.NKV == 0, "fused attention: n_kv_head ", L.NKV, " must divide n_head ", L.NH);
  STP_ASSERT(L.B >= 0 && L.T >= 0 && L.ldq >= L.NH * L.D && L.ldkv >= L.NKV * L.D && L.ldo >= L.NH * L.D,
             "fused attention: row strides narrower than the heads");
}

usize tiles(i64 n, i64 tile) { return static_cast<usize>((n + tile - 1) / tile); }

constexpr int kTile = static_cast<int>(kCpuAttentionTile);

}  // namespace

template <typename T>
void fused_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k,
                             const T* v) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH);
  if (s.device().kind() == DeviceKind::Cpu)
    launch(s, bh * tiles(L.T, kTile), FusedForward<T, kTile, kTile>{L, o, lse, q, k, v, scale}, 1);
  else
    launch(s, bh * static_cast<usize>(L.T), FusedForward<T, 1, 1>{L, o, lse, q, k, v, scale});
}

template <typename T>
void fused_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* delta, const T* dout,
                              const T* q, const T* k, const T* v, const T* o, const float* lse) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH), bg = static_cast<usize>(L.B * L.NKV);
  launch(s, bh * static_cast<usize>(L.T), FusedDelta<T>{L, delta, dout, o}, 1024);
  if (s.device().kind() == DeviceKind::Cpu) {
    launch(s, bg * tiles(L.T, kTile), FusedBackwardKV<T, kTile, kTile>{L, dk, dv, dout, q, k, v, lse, delta, scale}, 1);
    launch(s, bh * tiles(L.T, kTile), FusedBackwardQ<T, kTile, kTile>{L, dq, dout, q, k, v, lse, delta, scale}, 1);
  } else {
    launch(s, bg * static_cast<usize>(L.T), FusedBackwardKV<T, 1, 1>{L, dk, dv, dout, q, k, v, lse, delta, scale});
    launch(s, bh * static_cast<usize>(L.T), FusedBackwardQ<T, 1, 1>{L, dq, dout, q, k, v, lse, delta, scale});
  }
}

#define STP_FUSED_ATTENTION(T)                                                                                    \
  template void fused_attention_forward<T>(Stream&, const AttentionLayout&, T*, float*, const T*, const T*,     \
                                           const T*);                                                          \
  template void fused_attention_backward<T>(Stream&, const AttentionLayout&, T*, T*, T*, float*, const T*,      \
                                            const T*, const T*, const T*, const T*, const float*);
STP_FUSED_ATTENTION(float)
STP_FUSED_ATTENTION(bf16)
#undef STP_FUSED_ATTENTION

}  // namespace stp
