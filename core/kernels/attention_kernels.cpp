// Fused causal attention (contract in attention_kernels.h). The functors are templates on the tile
// sizes: the CUDA launch uses one row per thread, a plain CPU launch (nvcc builds, CPUs without
// AVX2 + FMA) kCpuAttentionTile rows per tile. GCC x86-64 host builds on AVX2 + FMA CPUs run the
// CPU stream through SimdForward / SimdBackward below instead: the same math and summation orders,
// on register-blocked 8-wide vector tile products.
#include "core/kernels/attention_kernels.h"

#include <cmath>
#include <vector>

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

// exp(x) for x <= 0 (every exponent here is a score minus a running max or a log-sum-exp), as
// straight-line arithmetic the compiler vectorises (a libm expf call is one element at a time):
// x = n ln2 + r with ln2 split in two (Cody-Waite, exact products for |n| < 2^8), a degree-6
// polynomial for exp(r) on |r| <= ln2 / 2 (the Cephes expf coefficients: relative error below
// 2^-23), and 2^n put into the exponent bits. Below -87, where exp(x) < 2^-125, it returns
// exp(-87) ~ 1.6e-38 instead of a denormal: 0 to f32 working precision against any real weight.
STP_HD inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float fx = x * 1.44269504088896341f;       // x / ln 2
  int n = static_cast<int>(fx);                    // truncates towards zero: floor for x <= 0 ...
  n -= static_cast<float>(n) > fx ? 1 : 0;         // ... once the non-integers below are moved down
  n += fx - static_cast<float>(n) > 0.5f ? 1 : 0;  // round to nearest: |r| <= ln2 / 2
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * bits_float(static_cast<std::uint32_t>(n + 127) << 23);
}

// Tiles live in f32 arrays of the task, some transposed ([d][row]) so that every inner loop runs
// over a tile dimension (BQ or BK, compile-time constants): contiguous, independent elements the
// compiler vectorises, while each element's sum still runs over d, keys or query rows in one fixed
// order. Rows past the end of a ragged tile are zero and masked out.

// dst[r][d] = src row r0 + r (row stride ld), r < nr; rows nr .. R are zero.
template <int R, typename T>
STP_HD inline void load_rows(float* dst, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 r = 0; r < R; ++r)
    for (i64 d = 0; d < D; ++d) dst[r * D + d] = r < nr ? to_f32(src[(r0 + r) * ld + d]) : 0.0f;
}

// dst[d][r] (transposed, R columns) = src row r0 + r; columns nr .. R are zero.
template <int R, typename T>
STP_HD inline void load_cols(float* dst, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 r = 0; r < R; ++r)
    for (i64 d = 0; d < D; ++d) dst[d * R + r] = r < nr ? to_f32(src[(r0 + r) * ld + d]) : 0.0f;
}

// acc (D, BQ) += p (nj, BQ)ᵀ-weighted rows (nj, D): acc[d][i] += Σ_j p[j][i] · rows[j][d], keys j in
// order for every element (the fixed summation order that makes the result deterministic). d is the
// outer loop, two rows of acc at a time sharing the loads of p, so they stay in registers.
template <int BQ>
STP_HD inline void accumulate_tile(float* acc, const float* p, const float* rows, i64 nj, i64 D) {
  i64 d = 0;
  for (; d + 2 <= D; d += 2)
    for (i64 j = 0; j < nj; ++j) {
      const float r0 = rows[j * D + d], r1 = rows[j * D + d + 1];
      for (int i = 0; i < BQ; ++i) {
        const float pij = p[j * BQ + i];
        acc[d * BQ + i] += pij * r0;
        acc[(d + 1) * BQ + i] += pij * r1;
      }
    }
  for (; d < D; ++d)
    for (i64 j = 0; j < nj; ++j) {
      const float rd = rows[j * D + d];
      for (int i = 0; i < BQ; ++i) acc[d * BQ + i] += p[j * BQ + i] * rd;
    }
}

// Rows of the row-major k tile FusedBackwardKV keeps for the one-pass dq (CPU tiles only; the
// one-row GPU instantiation never accumulates dq there and keeps one dummy row).
constexpr int dq_rows(int bk) { return bk > 1 ? bk : 1; }

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

// ---- Forward: one task per (b, h, query tile) ----------------------------------------------------
// Per key tile: scores st[j][i] = (k_j . q_i) * scale (sum over d in order), masked; the running
// max m and sum l per row are rescaled by exp(m_old - m_new), and so is the accumulator ot[d][i]
// before the tile's p_ij v_j are added in key order.

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
    const i64 D = L.D;
    const QueryTile Q = query_tile<BQ>(L, task);
    const HeadPtrs& P = Q.ptrs;
    const i64 bh = Q.bh, i0 = Q.i0, ni = Q.ni;
    float qt[kMaxD * BQ], ot[kMaxD * BQ], st[BK * BQ], kf[BK * kMaxD], vf[BK * kMaxD];
    float m[BQ], l[BQ], alpha[BQ], mt[BQ];
    load_cols<BQ>(qt, q + P.q, L.ldq, i0, ni, D);
    for (i64 x = 0; x < D * BQ; ++x) ot[x] = 0.0f;
    for (int i = 0; i < BQ; ++i) m[i] = kNoScore, l[i] = 0.0f;
    const i64 last_key = i0 + ni - 1;  // causal: no key after the tile's last query row
    for (i64 j0 = 0; j0 <= last_key; j0 += BK) {
      const i64 nj = min_i64(BK, last_key + 1 - j0);
      load_rows<BK>(kf, k + P.kv, L.ldkv, j0, nj, D);
      load_rows<BK>(vf, v + P.kv, L.ldkv, j0, nj, D);
      for (int x = 0; x < BK * BQ; ++x) st[x] = 0.0f;
      // Two keys at a time share each load of qt (register blocking); every score still sums d in order.
      i64 j2 = 0;
      for (; j2 + 2 <= nj; j2 += 2) {
        float a0[BQ], a1[BQ];  // accumulators the compiler can keep in registers over d
        for (int i = 0; i < BQ; ++i) a0[i] = a1[i] = 0.0f;
        for (i64 d = 0; d < D; ++d) {
          const float k0 = kf[j2 * D + d], k1 = kf[(j2 + 1) * D + d];
          for (int i = 0; i < BQ; ++i) {
            const float qv = qt[d * BQ + i];
            a0[i] += k0 * qv;
            a1[i] += k1 * qv;
          }
        }
        for (int i = 0; i < BQ; ++i) st[j2 * BQ + i] = a0[i], st[(j2 + 1) * BQ + i] = a1[i];
      }
      for (; j2 < nj; ++j2)
        for (i64 d = 0; d < D; ++d) {
          const float kd = kf[j2 * D + d];
          for (int i = 0; i < BQ; ++i) st[j2 * BQ + i] += kd * qt[d * BQ + i];
        }
      for (int i = 0; i < BQ; ++i) mt[i] = kNoScore;
      for (i64 j = 0; j < BK; ++j)
        for (int i = 0; i < BQ; ++i) {
          const bool valid = j < nj && i < ni && j0 + j <= i0 + i;
          const float sc = valid ? st[j * BQ + i] * scale : kNoScore;
          st[j * BQ + i] = sc;
          mt[i] = sc > mt[i] ? sc : mt[i];
        }
      for (int i = 0; i < BQ; ++i) {
        const float m_new = mt[i] > m[i] ? mt[i] : m[i];
        alpha[i] = exp_nonpositive(m[i] - m_new);
        m[i] = m_new;
        l[i] *= alpha[i];
      }
      for (i64 j = 0; j < BK; ++j)
        for (int i = 0; i < BQ; ++i) {
          const float sc = st[j * BQ + i];
          const float e = exp_nonpositive(sc - m[i]);
          const float p = sc == kNoScore ? 0.0f : e;
          st[j * BQ + i] = p;
          l[i] += p;
        }
      for (i64 d = 0; d < D; ++d)
        for (int i = 0; i < BQ; ++i) ot[d * BQ + i] *= alpha[i];
      accumulate_tile<BQ>(ot, st, vf, nj, D);  // o += P V
    }
    for (i64 i = 0; i < ni; ++i) {
      const float inv = 1.0f / l[i];
      T* orow = o + P.o + (i0 + i) * L.ldo;
      for (i64 d = 0; d < D; ++d) orow[d] = from_f32<T>(ot[d * BQ + i] * inv);
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
// tiles from the diagonal on, in order, each tile's rows in order. Per query tile: scores and
// dp_ij = do_i . v_j (sums over d in order), p = exp(s - lse), ds = p (dp - delta), then
// dvt[d][j] += p_ij do_i and dkt[d][j] += ds_ij q_i row by row.
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
    const i64 nkt = (L.T + BK - 1) / BK;
    const i64 bg = static_cast<i64>(task) / nkt;
    key_tile(bg / L.NKV, bg % L.NKV, static_cast<i64>(task) % nkt, nullptr);
  }
  // One key tile of (b, g). With dqacc (f32, row (b*NH + h)*T + t of D), also adds
  // ds_ij k_j to each query row's dq accumulator, keys in order (FusedBackwardCpu).
  STP_HD void key_tile(i64 b, i64 g, i64 kt_index, float* dqacc) const {
    const i64 D = L.D, rep = L.NH / L.NKV;
    const i64 j0 = kt_index * BK, nj = min_i64(BK, L.T - j0);
    float kt[kMaxD * BK], vt[kMaxD * BK], dkt[kMaxD * BK], dvt[kMaxD * BK], kf[dq_rows(BK) * kMaxD];
    float qf[BQ * kMaxD], dof[BQ * kMaxD], p[BQ * BK], ds[BQ * BK];
    const i64 kv_off = b * L.T * L.ldkv + g * L.D;
    load_cols<BK>(kt, k + kv_off, L.ldkv, j0, nj, D);
    load_cols<BK>(vt, v + kv_off, L.ldkv, j0, nj, D);
    if (dqacc) load_rows<dq_rows(BK)>(kf, k + kv_off, L.ldkv, j0, nj, D);
    for (i64 x = 0; x < D * BK; ++x) dkt[x] = dvt[x] = 0.0f;
    for (i64 hh = 0; hh < rep; ++hh) {
      const i64 h = g * rep + hh, bh = b * L.NH + h;
      const HeadPtrs P = head_offsets(L, b, h);
      for (i64 i0 = (j0 / BQ) * BQ; i0 < L.T; i0 += BQ) {
        const i64 ni = min_i64(BQ, L.T - i0);
        load_rows<BQ>(qf, q + P.q, L.ldq, i0, ni, D);
        load_rows<BQ>(dof, dout + P.o, L.ldo, i0, ni, D);
        for (int x = 0; x < BQ * BK; ++x) p[x] = ds[x] = 0.0f;
        // Scores, then do . v, two rows at a time sharing each load of kt / vt; sums over d in order.
        i64 i2 = 0;
        for (; i2 + 2 <= ni; i2 += 2) {
          for (i64 d = 0; d < D; ++d) {
            const float q0 = qf[i2 * D + d], q1 = qf[(i2 + 1) * D + d];
            for (int j = 0; j < BK; ++j) {
              const float kv = kt[d * BK + j];
              p[i2 * BK + j] += q0 * kv;
              p[(i2 + 1) * BK + j] += q1 * kv;
            }
          }
          for (i64 d = 0; d < D; ++d) {
            const float o0 = dof[i2 * D + d], o1 = dof[(i2 + 1) * D + d];
            for (int j = 0; j < BK; ++j) {
              const float vv = vt[d * BK + j];
              ds[i2 * BK + j] += o0 * vv;
              ds[(i2 + 1) * BK + j] += o1 * vv;
            }
          }
        }
        for (; i2 < ni; ++i2)
          for (i64 d = 0; d < D; ++d) {
            const float qd = qf[i2 * D + d], od = dof[i2 * D + d];
            for (int j = 0; j < BK; ++j) {
              p[i2 * BK + j] += qd * kt[d * BK + j];
              ds[i2 * BK + j] += od * vt[d * BK + j];
            }
          }
        for (i64 i = 0; i < ni; ++i) {
          const float z = lse[bh * L.T + i0 + i], dl = delta[bh * L.T + i0 + i];
          for (int j = 0; j < BK; ++j) {
            const bool valid = j < nj && j0 + j <= i0 + i;
            const float e = exp_nonpositive(p[i * BK + j] * scale - z);
            const float pij = valid ? e : 0.0f;
            p[i * BK + j] = pij;
            ds[i * BK + j] = pij * (ds[i * BK + j] - dl);
          }
        }
        // d outer, rows inner: rows of dvt and dkt stay in registers; rows still add in order.
        for (i64 d = 0; d < D; ++d)
          for (i64 i = 0; i < ni; ++i) {
            const float qd = qf[i * D + d], od = dof[i * D + d];
            for (int j = 0; j < BK; ++j) {
              dvt[d * BK + j] += p[i * BK + j] * od;
              dkt[d * BK + j] += ds[i * BK + j] * qd;
            }
          }
        if (dqacc) {
          for (i64 i = 0; i < ni; ++i) {
            float* row = dqacc + (bh * L.T + i0 + i) * D;
            for (i64 j = 0; j < nj; ++j) {
              const float g_ij = ds[i * BK + j];
              for (i64 d = 0; d < D; ++d) row[d] += g_ij * kf[j * D + d];
            }
          }
        }
      }
    }
    for (i64 j = 0; j < nj; ++j) {
      T* dkrow = dk + kv_off + (j0 + j) * L.ldkv;
      T* dvrow = dv + kv_off + (j0 + j) * L.ldkv;
      for (i64 d = 0; d < D; ++d) {
        dkrow[d] = from_f32<T>(dkt[d * BK + j] * scale);
        dvrow[d] = from_f32<T>(dvt[d * BK + j]);
      }
    }
  }
};

// CPU backward in one pass: one task per (b, k/v head g) walks its key tiles in order
// (FusedBackwardKV::key_tile, which writes that tile's dk and dv) and accumulates every query row's
// dq in f32 in `dqacc`, owned by the task (the group's heads, all rows); each dq element adds its
// keys in order (key tiles ascending, keys ascending). Saves recomputing the scores and do . v a
// second time for dq, at the price of B * NKV tasks instead of one per key tile.
template <typename T, int BQ, int BK>
struct FusedBackwardCpu {
  FusedBackwardKV<T, BQ, BK> kv;
  T* dq;
  float* dqacc;
  STP_HD void operator()(usize task) const {
    const AttentionLayout& L = kv.L;
    const i64 b = static_cast<i64>(task) / L.NKV, g = static_cast<i64>(task) % L.NKV, rep = L.NH / L.NKV;
    const i64 h0 = g * rep, rows = rep * L.T * L.D;
    float* acc = dqacc + (b * L.NH + h0) * L.T * L.D;  // the group's heads are adjacent
    for (i64 x = 0; x < rows; ++x) acc[x] = 0.0f;
    for (i64 kt = 0; kt * BK < L.T; ++kt) kv.key_tile(b, g, kt, dqacc);
    for (i64 hh = 0; hh < rep; ++hh) {
      const HeadPtrs P = head_offsets(L, b, h0 + hh);
      for (i64 t = 0; t < L.T; ++t) {
        const float* a = acc + (hh * L.T + t) * L.D;
        T* row = dq + P.q + t * L.ldq;
        for (i64 d = 0; d < L.D; ++d) row[d] = from_f32<T>(a[d] * kv.scale);
      }
    }
  }
};

// dq of one (b, h, query tile): the key tiles up to the diagonal in order, each tile's keys in
// order: dqt[d][i] += ds_ij k_j (scores and dp recomputed as in FusedBackwardKV).
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
    const i64 D = L.D;
    const QueryTile Q = query_tile<BQ>(L, task);
    const HeadPtrs& P = Q.ptrs;
    const i64 bh = Q.bh, i0 = Q.i0, ni = Q.ni;
    float qt[kMaxD * BQ], dot[kMaxD * BQ], dqt[kMaxD * BQ], kf[BK * kMaxD], vf[BK * kMaxD];
    float pt[BK * BQ], dst[BK * BQ], z[BQ], dl[BQ];
    load_cols<BQ>(qt, q + P.q, L.ldq, i0, ni, D);
    load_cols<BQ>(dot, dout + P.o, L.ldo, i0, ni, D);
    for (i64 x = 0; x < D * BQ; ++x) dqt[x] = 0.0f;
    for (int i = 0; i < BQ; ++i) {
      z[i] = i < ni ? lse[bh * L.T + i0 + i] : 0.0f;
      dl[i] = i < ni ? delta[bh * L.T + i0 + i] : 0.0f;
    }
    const i64 last_key = i0 + ni - 1;
    for (i64 j0 = 0; j0 <= last_key; j0 += BK) {
      const i64 nj = min_i64(BK, last_key + 1 - j0);
      load_rows<BK>(kf, k + P.kv, L.ldkv, j0, nj, D);
      load_rows<BK>(vf, v + P.kv, L.ldkv, j0, nj, D);
      for (int x = 0; x < BK * BQ; ++x) pt[x] = dst[x] = 0.0f;
      for (i64 j = 0; j < nj; ++j)
        for (i64 d = 0; d < D; ++d) {
          const float kd = kf[j * D + d], vd = vf[j * D + d];
          for (int i = 0; i < BQ; ++i) {
            pt[j * BQ + i] += kd * qt[d * BQ + i];
            dst[j * BQ + i] += vd * dot[d * BQ + i];
          }
        }
      for (i64 j = 0; j < nj; ++j)
        for (int i = 0; i < BQ; ++i) {
          const bool valid = i < ni && j0 + j <= i0 + i;
          const float e = exp_nonpositive(pt[j * BQ + i] * scale - z[i]);
          const float pij = valid ? e : 0.0f;
          dst[j * BQ + i] = pij * (dst[j * BQ + i] - dl[i]);
        }
      accumulate_tile<BQ>(dqt, dst, kf, nj, D);  // dq += dS K
    }
    for (i64 i = 0; i < ni; ++i) {
      T* row = dq + P.q + (i0 + i) * L.ldq;
      for (i64 d = 0; d < D; ++d) row[d] = from_f32<T>(dqt[d * BQ + i] * scale);
    }
  }
};

// ---- CPU path: register-blocked tile products over 8-wide vectors --------------------------------
// GCC host builds on x86-64 with AVX2 + FMA at run time (vector extensions; elsewhere, and in nvcc
// builds, the CPU runs the functors above).
// Every tile product is one routine, tile_product(), a 4-row x 16-column block of the result kept
// in eight vector registers while the inner dimension runs in order; scores, do . v, o += p v,
// dv += pᵀ do, dk += dsᵀ q and dq += ds k are all this shape. The exponentials and the masks run
// 8 keys at a time (exp_v, the vector form of exp_nonpositive). Sums run in the same fixed orders
// as the functors (over d ascending, keys ascending, query rows ascending), so the results are
// bitwise independent of the thread count.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__)
#define STP_ATTENTION_SIMD 1
// The vector helpers are inlined into their callers (flattened into the AVX2 copy), so no vector
// ever crosses a call boundary; GCC's note that a 32-byte vector return changes the ABI without
// AVX does not apply (GCC reports it where the templates are instantiated, at the end of this
// file, so it stays off for the rest of the file).
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));  // unaligned loads and stores
typedef std::int32_t i8 __attribute__((vector_size(32)));

inline v8 vload(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline void vstore(float* p, v8 x) { *reinterpret_cast<v8u*>(p) = x; }
inline v8 vsplat(float x) { return v8{} + x; }

// exp_nonpositive on 8 lanes: the same steps (clamp, Cody-Waite reduction, the degree-6
// polynomial, 2^n through the exponent bits). A comparison yields -1 per true lane, so `n += c`
// subtracts one where c holds.
inline v8 exp_v(v8 x) {
  x = x < vsplat(-87.0f) ? vsplat(-87.0f) : x;
  const v8 fx = x * 1.44269504088896341f;
  i8 n = __builtin_convertvector(fx, i8);
  n += __builtin_convertvector(n, v8) > fx;
  n -= fx - __builtin_convertvector(n, v8) > vsplat(0.5f);
  const v8 nf = __builtin_convertvector(n, v8);
  const v8 r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  v8 y = vsplat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * (v8)((n + 127) << 23);
}

// c[r][0 .. ncols) = (acc ? c[r][.] * (alpha ? alpha[r] : 1) : 0) + sum_{k < nk} w[r*wr + k*wk] * x[k*ldx + .]
// for r < nrows (a multiple of 4) and ncols a multiple of 16; k runs in order for every element.
// The 4 x 16 block lives in eight registers over the whole k loop (a tile array would be loaded
// and stored per k: the plain functors' bottleneck).
inline void tile_product(float* c, i64 ldc, i64 nrows, i64 ncols, bool acc, const float* alpha, const float* w, i64 wr,
                         i64 wk, const float* x, i64 ldx, i64 nk) {
  for (i64 r = 0; r < nrows; r += 4)
    for (i64 cc = 0; cc < ncols; cc += 16) {
      float* c0 = c + r * ldc + cc;
      v8 a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};
      if (acc) {
        const v8 s0 = vsplat(alpha ? alpha[r] : 1.0f), s1 = vsplat(alpha ? alpha[r + 1] : 1.0f);
        const v8 s2 = vsplat(alpha ? alpha[r + 2] : 1.0f), s3 = vsplat(alpha ? alpha[r + 3] : 1.0f);
        a00 = vload(c0) * s0, a01 = vload(c0 + 8) * s0;
        a10 = vload(c0 + ldc) * s1, a11 = vload(c0 + ldc + 8) * s1;
        a20 = vload(c0 + 2 * ldc) * s2, a21 = vload(c0 + 2 * ldc + 8) * s2;
        a30 = vload(c0 + 3 * ldc) * s3, a31 = vload(c0 + 3 * ldc + 8) * s3;
      }
      const float* w0 = w + r * wr;
      for (i64 k = 0; k < nk; ++k) {
        const v8 x0 = vload(x + k * ldx + cc), x1 = vload(x + k * ldx + cc + 8);
        const float* wk0 = w0 + k * wk;
        const v8 b0 = vsplat(wk0[0]), b1 = vsplat(wk0[wr]), b2 = vsplat(wk0[2 * wr]), b3 = vsplat(wk0[3 * wr]);
        a00 += b0 * x0, a01 += b0 * x1;
        a10 += b1 * x0, a11 += b1 * x1;
        a20 += b2 * x0, a21 += b2 * x1;
        a30 += b3 * x0, a31 += b3 * x1;
      }
      vstore(c0, a00), vstore(c0 + 8, a01);
      vstore(c0 + ldc, a10), vstore(c0 + ldc + 8, a11);
      vstore(c0 + 2 * ldc, a20), vstore(c0 + 2 * ldc + 8, a21);
      vstore(c0 + 3 * ldc, a30), vstore(c0 + 3 * ldc + 8, a31);
    }
}

// Query rows per forward task and keys per forward step; keys per backward step and query rows per
// backward step. A forward task packs each key/v tile once for kFwdRows query rows, and a backward
// step packs each query/do tile once for kBwdKeys keys: fewer passes over k and v (or q and do),
// whose rows are strided in memory (packed qkv) and at long T come from beyond the caches; measured
// at T = 4096 the 32 x 32 tiles spent half their time packing. Within a block, rows (keys) that the
// causal mask hides from the whole step are skipped in blocks of 4 (16 columns).
constexpr i64 kFwdRows = 128, kFwdKeys = 32, kBwdKeys = 128, kBwdRows = 32;
constexpr i64 kPadD = kMaxD;  // tile buffers hold up to this many columns

inline i64 padded_d(i64 D) { return (D + 15) / 16 * 16; }
inline i64 round_up(i64 n, i64 m) { return (n + m - 1) / m * m; }

// f32 scratch of this thread for one task's tiles: fixed size, independent of T (what the tiles
// would take on the stack, which at these block sizes is too much for a worker thread's).
inline float* tile_scratch(usize n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// dst[r][c] (row stride ldd) = src row r0 + r, column c, for r < nr and c < D; zero up to R rows
// and ldd columns.
template <typename T>
inline void pack_rows(float* dst, i64 ldd, i64 R, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 r = 0; r < R; ++r)
    for (i64 c = 0; c < ldd; ++c) dst[r * ldd + c] = r < nr && c < D ? to_f32(src[(r0 + r) * ld + c]) : 0.0f;
}
// dst[c][r] (R columns) = src row r0 + r, column c, for c < D; rows r >= nr are zero.
template <typename T>
inline void pack_cols(float* dst, i64 R, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 r = 0; r < R; ++r)
    for (i64 c = 0; c < D; ++c) dst[c * R + r] = r < nr ? to_f32(src[(r0 + r) * ld + c]) : 0.0f;
}

// Forward, one task per (b, h, block of kFwdRows query rows): per key tile, s = q kᵀ (4 x 16
// blocks, d in order), the online softmax per row 8 keys at a time, then o = o * alpha + p v (keys
// in order). Rows before the key tile's first key see none of it and are left alone.
template <typename T>
struct SimdForward {
  AttentionLayout L;
  T* o;
  float* lse;
  const T* q;
  const T* k;
  const T* v;
  float scale;
  void operator()(usize task) const {
    constexpr i64 R = kFwdRows, K = kFwdKeys;
    const i64 D = L.D, Dp = padded_d(D);
    const QueryTile Q = query_tile<static_cast<int>(R)>(L, task);
    const HeadPtrs& P = Q.ptrs;
    const i64 i0 = Q.i0, ni = Q.ni, rows = round_up(ni, 4);
    float* qb = tile_scratch(static_cast<usize>(2 * R * kPadD + 2 * K * kPadD + R * K + 3 * R));
    float *ob = qb + R * kPadD, *kt = ob + R * kPadD, *vb = kt + K * kPadD, *s = vb + K * kPadD;
    float *m = s + R * K, *l = m + R, *alpha = l + R;
    pack_rows(qb, Dp, rows, q + P.q, L.ldq, i0, ni, D);
    for (i64 x = 0; x < rows * Dp; ++x) ob[x] = 0.0f;
    for (i64 i = 0; i < rows; ++i) m[i] = kNoScore, l[i] = 0.0f;
    const i64 last_key = i0 + ni - 1;
    for (i64 j0 = 0; j0 <= last_key; j0 += K) {
      const i64 nj = min_i64(K, last_key + 1 - j0);
      const i64 r0 = (j0 > i0 ? j0 - i0 : 0) / 4 * 4;  // rows i < j0 - i0 see no key of this tile
      pack_cols(kt, K, k + P.kv, L.ldkv, j0, nj, D);
      pack_rows(vb, Dp, K, v + P.kv, L.ldkv, j0, nj, D);
      tile_product(s + r0 * K, K, rows - r0, K, false, nullptr, qb + r0 * Dp, Dp, 1, kt, K, D);
      for (i64 i = r0; i < rows; ++i) {
        float* row = s + i * K;
        // Keys past the row's diagonal, past the tile and every key of a padding row are masked.
        const i64 valid = i < ni ? min_i64(nj, i0 + i - j0 + 1) : 0;
        v8 mx = vsplat(kNoScore);
        for (i64 j = 0; j < K; j += 8) {
          const v8 jj = v8{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<float>(j);
          const v8 sc = jj < vsplat(static_cast<float>(valid)) ? vload(row + j) * scale : vsplat(kNoScore);
          vstore(row + j, sc);
          mx = sc > mx ? sc : mx;
        }
        float mt = kNoScore;
        for (int e = 0; e < 8; ++e) mt = mx[e] > mt ? mx[e] : mt;
        const float m_new = mt > m[i] ? mt : m[i];
        alpha[i] = exp_nonpositive(m[i] - m_new);
        m[i] = m_new;
        v8 sum = {};
        for (i64 j = 0; j < K; j += 8) {
          const v8 sc = vload(row + j);
          const v8 p = sc == vsplat(kNoScore) ? v8{} : exp_v(sc - m_new);
          vstore(row + j, p);
          sum += p;
        }
        float ls = 0.0f;
        for (int e = 0; e < 8; ++e) ls += sum[e];
        l[i] = l[i] * alpha[i] + ls;
      }
      // o = o * alpha + p v
      tile_product(ob + r0 * Dp, Dp, rows - r0, Dp, true, alpha + r0, s + r0 * K, K, 1, vb, Dp, nj);
    }
    for (i64 i = 0; i < ni; ++i) {
      const float inv = 1.0f / l[i];
      T* orow = o + P.o + (i0 + i) * L.ldo;
      for (i64 d = 0; d < D; ++d) orow[d] = from_f32<T>(ob[i * Dp + d] * inv);
      lse[Q.bh * L.T + i0 + i] = m[i] + logf(l[i]);
    }
  }
};

// Backward in one pass, one task per (b, k/v head g): its blocks of kBwdKeys keys in order; per
// block the group's query heads in order, each over its tiles of kBwdRows query rows from the
// diagonal on: s = q kᵀ and dp = do vᵀ, p = exp(s - lse), ds = p (dp - delta), then dv += pᵀ do,
// dk += dsᵀ q (query rows in order) and the rows' f32 dq accumulators (the workspace, owned by this
// task) += ds k (keys in order, blocks ascending across the walk). Keys of the block past a query
// tile's last row are skipped.
template <typename T>
struct SimdBackward {
  AttentionLayout L;
  T* dq;
  T* dk;
  T* dv;
  float* dqacc;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const float* lse;
  const float* delta;
  float scale;
  void operator()(usize task) const {
    constexpr i64 K = kBwdKeys, R = kBwdRows;
    const i64 D = L.D, Dp = padded_d(D), T_ = L.T, rep = L.NH / L.NKV;
    const i64 b = static_cast<i64>(task) / L.NKV, g = static_cast<i64>(task) % L.NKV, h0 = g * rep;
    float* acc = dqacc + (b * L.NH + h0) * T_ * D;  // the group's heads are adjacent
    for (i64 x = 0; x < rep * T_ * D; ++x) acc[x] = 0.0f;
    float* kt = tile_scratch(static_cast<usize>(5 * K * kPadD + 3 * R * kPadD + 2 * R * K));
    float *vt = kt + K * kPadD, *kb = vt + K * kPadD, *dkb = kb + K * kPadD, *dvb = dkb + K * kPadD;
    float *qb = dvb + K * kPadD, *dob = qb + R * kPadD, *dqb = dob + R * kPadD, *s = dqb + R * kPadD, *dp = s + R * K;
    const i64 kv_off = b * T_ * L.ldkv + g * D;
    for (i64 j0 = 0; j0 < T_; j0 += K) {
      const i64 nj = min_i64(K, T_ - j0);
      pack_cols(kt, K, k + kv_off, L.ldkv, j0, nj, D);
      pack_cols(vt, K, v + kv_off, L.ldkv, j0, nj, D);
      pack_rows(kb, Dp, K, k + kv_off, L.ldkv, j0, nj, D);
      for (i64 x = 0; x < K * Dp; ++x) dkb[x] = dvb[x] = 0.0f;
      for (i64 hh = 0; hh < rep; ++hh) {
        const i64 h = h0 + hh, bh = b * L.NH + h;
        const HeadPtrs P = head_offsets(L, b, h);
        for (i64 i0 = j0 / R * R; i0 < T_; i0 += R) {
          const i64 ni = min_i64(R, T_ - i0);
          const i64 kc = min_i64(nj, i0 + ni - j0);  // keys of the block some row of the tile sees
          const i64 cols = round_up(kc, 16), krows = round_up(kc, 4);
          pack_rows(qb, Dp, R, q + P.q, L.ldq, i0, ni, D);
          pack_rows(dob, Dp, R, dout + P.o, L.ldo, i0, ni, D);
          tile_product(s, K, R, cols, false, nullptr, qb, Dp, 1, kt, K, D);
          tile_product(dp, K, R, cols, false, nullptr, dob, Dp, 1, vt, K, D);
          for (i64 i = 0; i < R; ++i) {
            const i64 valid = i < ni ? min_i64(nj, i0 + i - j0 + 1) : 0;
            const v8 z = vsplat(i < ni ? lse[bh * T_ + i0 + i] : 0.0f);
            const v8 dl = vsplat(i < ni ? delta[bh * T_ + i0 + i] : 0.0f);
            for (i64 j = 0; j < cols; j += 8) {
              const v8 jj = v8{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<float>(j);
              const v8 e = exp_v(vload(s + i * K + j) * scale - z);
              const v8 p = jj < vsplat(static_cast<float>(valid)) ? e : v8{};
              vstore(s + i * K + j, p);
              vstore(dp + i * K + j, p * (vload(dp + i * K + j) - dl));
            }
          }
          tile_product(dvb, Dp, krows, Dp, true, nullptr, s, 1, K, dob, Dp, ni);  // dv += pᵀ do
          tile_product(dkb, Dp, krows, Dp, true, nullptr, dp, 1, K, qb, Dp, ni);  // dk += dsᵀ q
          float* arow = acc + (hh * T_ + i0) * D;
          for (i64 i = 0; i < R; ++i)
            for (i64 d = 0; d < Dp; ++d) dqb[i * Dp + d] = i < ni && d < D ? arow[i * D + d] : 0.0f;
          tile_product(dqb, Dp, R, Dp, true, nullptr, dp, K, 1, kb, Dp, kc);  // dq += ds k
          for (i64 i = 0; i < ni; ++i)
            for (i64 d = 0; d < D; ++d) arow[i * D + d] = dqb[i * Dp + d];
        }
      }
      for (i64 j = 0; j < nj; ++j) {
        T* dkrow = dk + kv_off + (j0 + j) * L.ldkv;
        T* dvrow = dv + kv_off + (j0 + j) * L.ldkv;
        for (i64 d = 0; d < D; ++d) {
          dkrow[d] = from_f32<T>(dkb[j * Dp + d] * scale);
          dvrow[d] = from_f32<T>(dvb[j * Dp + d]);
        }
      }
    }
    for (i64 hh = 0; hh < rep; ++hh) {
      const HeadPtrs P = head_offsets(L, b, h0 + hh);
      for (i64 t = 0; t < T_; ++t) {
        const float* a = acc + (hh * T_ + t) * D;
        T* row = dq + P.q + t * L.ldq;
        for (i64 d = 0; d < D; ++d) row[d] = from_f32<T>(a[d] * scale);
      }
    }
  }
};
#endif

// CPU only, pure host build: the vector path's task bodies compiled for AVX2 + FMA, chosen at run
// time when the CPU has them. `flatten` inlines the whole body (tile products, exponentials,
// to_f32/from_f32) into the AVX2 function, so the 8-wide vectors become single ymm registers and
// the multiply-adds fused ones. A CPU without AVX2 + FMA, and an nvcc build, run the plain functors
// instead (tiles of kCpuAttentionTile; they may round differently, and are bitwise reproducible
// on one machine too).
#if defined(STP_ATTENTION_SIMD)
template <typename F>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(const F& f, usize i) {
  f(i);
}
template <typename F>
struct Avx2Task {
  F f;
  void operator()(usize i) const { run_avx2(f, i); }
};
bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

void check_layout(const AttentionLayout& L) {
  STP_CHECK(L.D >= 1 && L.D <= kMaxAttentionHeadDim, "fused attention: head dimension ", L.D, " is outside [1, ",
            kMaxAttentionHeadDim, "]; use model.attention: naive");
  STP_CHECK(L.NKV >= 1 && L.NH % L.NKV == 0, "fused attention: n_kv_head ", L.NKV, " must divide n_head ", L.NH);
  STP_ASSERT(L.B >= 0 && L.T >= 0 && L.ldq >= L.NH * L.D && L.ldkv >= L.NKV * L.D && L.ldo >= L.NH * L.D,
             "fused attention: row strides narrower than the heads");
}

usize tiles(i64 n, i64 tile) { return static_cast<usize>((n + tile - 1) / tile); }

}  // namespace

std::int64_t fused_attention_backward_workspace(const AttentionLayout& L) { return L.B * L.NH * L.T * (1 + L.D); }

namespace {

constexpr int kTile = static_cast<int>(kCpuAttentionTile);

}  // namespace

template <typename T>
void fused_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k,
                             const T* v) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH);
  if (s.device().kind() == DeviceKind::Cpu) {
#if defined(STP_ATTENTION_SIMD)
    if (cpu_has_avx2_fma()) {
      launch(s, bh * tiles(L.T, kFwdRows), Avx2Task<SimdForward<T>>{{L, o, lse, q, k, v, scale}}, 1);
      return;
    }
#endif
    launch(s, bh * tiles(L.T, kTile), FusedForward<T, kTile, kTile>{L, o, lse, q, k, v, scale}, 1);
  } else {
    launch(s, bh * static_cast<usize>(L.T), FusedForward<T, 1, 1>{L, o, lse, q, k, v, scale});
  }
}

template <typename T>
void fused_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* workspace, const T* dout,
                              const T* q, const T* k, const T* v, const T* o, const float* lse) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH), bg = static_cast<usize>(L.B * L.NKV);
  float* delta = workspace;
  launch(s, bh * static_cast<usize>(L.T), FusedDelta<T>{L, delta, dout, o}, 1024);
  if (s.device().kind() == DeviceKind::Cpu) {
    float* dqacc = workspace + L.B * L.NH * L.T;
#if defined(STP_ATTENTION_SIMD)
    if (cpu_has_avx2_fma()) {
      launch(s, bg, Avx2Task<SimdBackward<T>>{{L, dq, dk, dv, dqacc, dout, q, k, v, lse, delta, scale}}, 1);
      return;
    }
#endif
    launch(s, bg, FusedBackwardCpu<T, kTile, kTile>{{L, dk, dv, dout, q, k, v, lse, delta, scale}, dq, dqacc}, 1);
  } else {
    launch(s, bg * static_cast<usize>(L.T), FusedBackwardKV<T, 1, 1>{L, dk, dv, dout, q, k, v, lse, delta, scale});
    launch(s, bh * static_cast<usize>(L.T), FusedBackwardQ<T, 1, 1>{L, dq, dout, q, k, v, lse, delta, scale});
  }
}

#define STP_FUSED_ATTENTION(T)                                                                                         \
  template void fused_attention_forward<T>(Stream&, const AttentionLayout&, T*, float*, const T*, const T*, const T*); \
  template void fused_attention_backward<T>(Stream&, const AttentionLayout&, T*, T*, T*, float*, const T*, const T*,   \
                                            const T*, const T*, const T*, const float*);
STP_FUSED_ATTENTION(float)
STP_FUSED_ATTENTION(bf16)
#undef STP_FUSED_ATTENTION

}  // namespace stp
