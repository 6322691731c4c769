// Fused causal attention (contract in attention_kernels.h). The functors are templates on the tile
// sizes, and the stream's backend picks the layout (row_tiles, core/launch_shape.h): tiles of
// kCpuAttentionTile rows per oneTBB task on a CPU stream, a block of threads per tile on CUDA
// (RowBlock: one row or key per thread, the shared operand tiles staged in block-shared memory). A
// CPU stream takes the vector path instead where it is built and the CPU has AVX2 + FMA (GCC x86-64
// host builds, nvcc's with GCC as host compiler too; attention_kernels_avx2.cpp): the same math and
// summation orders (the tile walks of attention_tiles.h), on register-blocked 8-wide vector tile
// products.
#include "core/kernels/attention_kernels.h"

#include <cmath>

#include "base/error.h"
#include "core/kernels/attention_tiles.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

using namespace attention_detail;

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
    const i64 i0 = Q.i0, ni = Q.ni;
    float qt[kMaxD * BQ], ot[kMaxD * BQ], st[BK * BQ], kf[BK * kMaxD], vf[BK * kMaxD];
    float m[BQ], l[BQ], alpha[BQ], mt[BQ];
    load_cols<BQ>(qt, q + P.q, L.ldq, i0, ni, D);
    for (i64 x = 0; x < D * BQ; ++x) ot[x] = 0.0f;
    for (int i = 0; i < BQ; ++i) m[i] = kNoScore, l[i] = 0.0f;
    for_each_key_tile<BK>(i0, ni, [&](i64 j0, i64 nj) {
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
    });
    write_query_rows(L, Q, o, lse, ot, 1, BQ, m, l);
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

// dk, dv of one (b, k/v head g, key tile), the step of FusedBackwardCpu: the group's query heads in
// order, each over its query tiles from the diagonal on, in order, each tile's rows in order. Per
// query tile: scores and dp_ij = do_i . v_j (sums over d in order), p = exp(s - lse),
// ds = p (dp - delta), then dvt[d][j] += p_ij do_i and dkt[d][j] += ds_ij q_i row by row.
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
  // One key tile of (b, g). With dqacc (f32, row (b*NH + h)*T + t of D), also adds
  // ds_ij k_j to each query row's dq accumulator, keys in order (FusedBackwardCpu).
  STP_HD void key_tile(i64 b, i64 g, i64 kt_index, float* dqacc) const {
    const i64 D = L.D;
    const i64 j0 = kt_index * BK, nj = min_i64(BK, L.T - j0);
    float kt[kMaxD * BK], vt[kMaxD * BK], dkt[kMaxD * BK], dvt[kMaxD * BK], kf[BK * kMaxD];
    float qf[BQ * kMaxD], dof[BQ * kMaxD], p[BQ * BK], ds[BQ * BK];
    const i64 kv_off = b * L.T * L.ldkv + g * L.D;
    load_cols<BK>(kt, k + kv_off, L.ldkv, j0, nj, D);
    load_cols<BK>(vt, v + kv_off, L.ldkv, j0, nj, D);
    if (dqacc) load_rows<BK>(kf, k + kv_off, L.ldkv, j0, nj, D);
    for (i64 x = 0; x < D * BK; ++x) dkt[x] = dvt[x] = 0.0f;
    for_each_query_tile<BQ>(L, b, g, j0, [&](i64, i64 bh, const HeadPtrs& P, i64 i0, i64 ni) {
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
    });
    write_kv_rows(L, dk, dv, kv_off, j0, nj, dkt, dvt, 1, BK, scale);
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
    const i64 b = static_cast<i64>(task) / L.NKV, g = static_cast<i64>(task) % L.NKV;
    const float* acc = group_dq_accumulators(L, dqacc, b, g);
    for (i64 kt = 0; kt * BK < L.T; ++kt) kv.key_tile(b, g, kt, dqacc);
    write_group_dq(L, acc, dq, b, g, kv.scale);
  }
};

// ---- CUDA layout: a block of threads per tile (RowBlock, core/launch_shape.h) ---------------------
// Each functor is a block program of Block::threads threads, one query row (or key) per thread. The
// block stages the operands its rows share, kTile keys (or query rows) at a time, in block-shared
// memory (thread t loads elements t, t + threads, ... of the tile: adjacent threads, adjacent
// elements), and walks the tiles of attention_tiles.h in their order. A thread computes each of its
// values by the expressions of the plain functors above with tiles of kTile rows and keys, in their
// order, and visits exactly the tiles they visit for its row (or key): o, lse, dq, dk and dv are
// bitwise those of FusedForward<T, kTile, kTile> and FusedBackwardCpu<T, kTile, kTile> (but for
// nvcc's fused multiply-adds). Block-shared memory per block, f32 tiles of kTile rows of up to kMaxD
// columns: the forward and dq 2 * 32 * 128 * 4 B = 32 KiB (k and v), dk/dv 32 KiB (q and do) and
// 256 B (lse and delta): within the 48 KiB of static shared memory.

constexpr int kTile = static_cast<int>(kCpuAttentionTile);

// Thread t's share of staging a tile: dst[x] for x = t, t + Threads, ... < Rows * D, row x / D of
// src (rows from r0, row stride ld) widened; rows past nr are zero.
template <int Threads, int Rows, typename T>
STP_HD inline void stage_rows(int t, float* dst, const T* src, i64 ld, i64 r0, i64 nr, i64 D) {
  for (i64 x = t; x < Rows * D; x += Threads) {
    const i64 r = x / D, d = x - r * D;
    dst[x] = r < nr ? to_f32(src[(r0 + r) * ld + d]) : 0.0f;
  }
}

// Forward state of one query row: its q, its output accumulator, running max and sum.
struct ForwardRow {
  float q[kMaxD], acc[kMaxD], m, l;
};

// Query row i's step over the key tile j0 .. j0 + nj (staged: ks, vs, rows of D), FusedForward's
// for one of its rows: the tile's kTile scores (masked past the diagonal and the tile), the running
// max and the rescale, p = exp(s - m) summed into l key by key, acc * alpha, then acc += p v keys in
// order.
STP_HD inline void forward_row_step(ForwardRow& r, const float* ks, const float* vs, i64 i, i64 j0, i64 nj, i64 D,
                                    float scale) {
  float st[kTile];
  float mt = kNoScore;
  for (i64 j = 0; j < kTile; ++j) {
    float a = 0.0f;
    if (j < nj)
      for (i64 d = 0; d < D; ++d) a += ks[j * D + d] * r.q[d];
    const bool valid = j < nj && j0 + j <= i;
    const float sc = valid ? a * scale : kNoScore;
    st[j] = sc;
    mt = sc > mt ? sc : mt;
  }
  const float m_new = mt > r.m ? mt : r.m;
  const float alpha = exp_nonpositive(r.m - m_new);
  r.m = m_new;
  r.l *= alpha;
  for (i64 j = 0; j < kTile; ++j) {
    const float sc = st[j];
    const float e = exp_nonpositive(sc - r.m);
    const float p = sc == kNoScore ? 0.0f : e;
    st[j] = p;
    r.l += p;
  }
  for (i64 d = 0; d < D; ++d) r.acc[d] *= alpha;
  for (i64 j = 0; j < nj; ++j)
    for (i64 d = 0; d < D; ++d) r.acc[d] += st[j] * vs[j * D + d];
}

// Forward, one block per (b, h, query tile of Block::rows rows): per key tile up to the tile's last
// row, stage k and v, then each row takes its step (rows before the key tile see none of it and
// skip it, as the plain functor's tiles of kTile rows never reach it).
template <typename T, typename Block>
struct FusedForwardBlock {
  AttentionLayout L;
  T* o;
  float* lse;
  const T* q;
  const T* k;
  const T* v;
  float scale;
  STP_HD void operator()(usize task) const {
    constexpr int N = Block::threads;
    const i64 D = L.D;
    const QueryTile Q = query_tile<N>(L, task);
    const HeadPtrs& P = Q.ptrs;
    STP_BLOCK_SHARED float ks[kTile * kMaxD], vs[kTile * kMaxD];
    PerThread<ForwardRow, N> rows;
    Block::phase([&](int t) {
      ForwardRow& r = rows[t];
      for (i64 d = 0; d < D; ++d) {
        r.q[d] = t < Q.ni ? to_f32(q[P.q + (Q.i0 + t) * L.ldq + d]) : 0.0f;
        r.acc[d] = 0.0f;
      }
      r.m = kNoScore, r.l = 0.0f;
    });
    for_each_key_tile<kTile>(Q.i0, Q.ni, [&](i64 j0, i64 nj) {
      Block::phase([&](int t) {
        stage_rows<N, kTile>(t, ks, k + P.kv, L.ldkv, j0, nj, D);
        stage_rows<N, kTile>(t, vs, v + P.kv, L.ldkv, j0, nj, D);
      });
      Block::phase([&](int t) {
        if (t < Q.ni && j0 <= Q.i0 + t) forward_row_step(rows[t], ks, vs, Q.i0 + t, j0, nj, D, scale);
      });
    });
    Block::phase([&](int t) {
      if (t >= Q.ni) return;
      const QueryTile row{P, Q.bh, Q.i0 + t, 1};
      write_query_rows(L, row, o, lse, rows[t].acc, 0, 1, &rows[t].m, &rows[t].l);
    });
  }
};

// Backward state of one key: its k and v, its dk and dv accumulators.
struct BackwardKey {
  float k[kMaxD], v[kMaxD], dk[kMaxD], dv[kMaxD];
};

// Key j's step over the query tile i0 .. i0 + ni (staged: qs, dos, rows of D; zs, dls its lse and
// delta), FusedBackwardKV's for one of its keys: row by row, the score and dp (sums over d in
// order), p = exp(s - lse) (0 past the diagonal), ds = p (dp - delta), dv += p do, dk += ds q.
STP_HD inline void backward_key_step(BackwardKey& key, const float* qs, const float* dos, const float* zs,
                                     const float* dls, i64 j, i64 i0, i64 ni, i64 D, float scale) {
  for (i64 i = 0; i < ni; ++i) {
    const float* qi = qs + i * D;
    const float* doi = dos + i * D;
    float s = 0.0f, dp = 0.0f;
    for (i64 d = 0; d < D; ++d) s += qi[d] * key.k[d];
    for (i64 d = 0; d < D; ++d) dp += doi[d] * key.v[d];
    const float e = exp_nonpositive(s * scale - zs[i]);
    const float pij = j <= i0 + i ? e : 0.0f;
    const float ds = pij * (dp - dls[i]);
    for (i64 d = 0; d < D; ++d) {
      key.dv[d] += pij * doi[d];
      key.dk[d] += ds * qi[d];
    }
  }
}

// dk and dv, one block per (b, k/v head g, key tile of Block::rows keys): the group's query heads in
// order, each over its query tiles of kTile rows from the block's diagonal on (for_each_query_tile),
// staged with their lse and delta; each key takes the tiles from its own kTile-key tile's diagonal
// on (the plain functor's walk for that tile).
template <typename T, typename Block>
struct FusedBackwardKVBlock {
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
    constexpr int N = Block::threads;
    const i64 D = L.D, nkt = (L.T + N - 1) / N;
    const i64 bg = static_cast<i64>(task) / nkt, b = bg / L.NKV, g = bg % L.NKV;
    const i64 j0 = static_cast<i64>(task) % nkt * N, nj = min_i64(N, L.T - j0);
    const i64 kv_off = b * L.T * L.ldkv + g * D;
    STP_BLOCK_SHARED float qs[kTile * kMaxD], dos[kTile * kMaxD], zs[kTile], dls[kTile];
    PerThread<BackwardKey, N> keys;
    Block::phase([&](int t) {
      BackwardKey& key = keys[t];
      for (i64 d = 0; d < D; ++d) {
        key.k[d] = t < nj ? to_f32(k[kv_off + (j0 + t) * L.ldkv + d]) : 0.0f;
        key.v[d] = t < nj ? to_f32(v[kv_off + (j0 + t) * L.ldkv + d]) : 0.0f;
        key.dk[d] = key.dv[d] = 0.0f;
      }
    });
    for_each_query_tile<kTile>(L, b, g, j0, [&](i64, i64 bh, const HeadPtrs& P, i64 i0, i64 ni) {
      Block::phase([&](int t) {
        stage_rows<N, kTile>(t, qs, q + P.q, L.ldq, i0, ni, D);
        stage_rows<N, kTile>(t, dos, dout + P.o, L.ldo, i0, ni, D);
        for (i64 i = t; i < kTile; i += N) {
          zs[i] = i < ni ? lse[bh * L.T + i0 + i] : 0.0f;
          dls[i] = i < ni ? delta[bh * L.T + i0 + i] : 0.0f;
        }
      });
      Block::phase([&](int t) {
        if (t < nj && i0 + kTile > j0 + t) backward_key_step(keys[t], qs, dos, zs, dls, j0 + t, i0, ni, D, scale);
      });
    });
    Block::phase([&](int t) {
      if (t < nj) write_kv_rows(L, dk, dv, kv_off, j0 + t, 1, keys[t].dk, keys[t].dv, 0, 1, scale);
    });
  }
};

// Backward state of one query row: its q and do, its dq accumulator, lse and delta.
struct BackwardRow {
  float q[kMaxD], dout[kMaxD], dq[kMaxD], z, dl;
};

// Query row i's dq step over the key tile j0 .. j0 + nj (staged: ks, vs), FusedBackwardCpu's for
// that row: key by key, ds_ij as FusedBackwardKV computes it, then dq += ds_ij k_j.
STP_HD inline void dq_row_step(BackwardRow& r, const float* ks, const float* vs, i64 i, i64 j0, i64 nj, i64 D,
                               float scale) {
  for (i64 j = 0; j < nj; ++j) {
    const float* kj = ks + j * D;
    const float* vj = vs + j * D;
    float s = 0.0f, dp = 0.0f;
    for (i64 d = 0; d < D; ++d) s += r.q[d] * kj[d];
    for (i64 d = 0; d < D; ++d) dp += r.dout[d] * vj[d];
    const float e = exp_nonpositive(s * scale - r.z);
    const float pij = j0 + j <= i ? e : 0.0f;
    const float ds = pij * (dp - r.dl);
    for (i64 d = 0; d < D; ++d) r.dq[d] += ds * kj[d];
  }
}

// dq, one block per (b, h, query tile of Block::rows rows): per key tile up to the tile's last row,
// stage k and v, then each row that the key tile reaches takes its step; dq = acc * scale.
template <typename T, typename Block>
struct FusedBackwardQBlock {
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
    constexpr int N = Block::threads;
    const i64 D = L.D;
    const QueryTile Q = query_tile<N>(L, task);
    const HeadPtrs& P = Q.ptrs;
    STP_BLOCK_SHARED float ks[kTile * kMaxD], vs[kTile * kMaxD];
    PerThread<BackwardRow, N> rows;
    Block::phase([&](int t) {
      BackwardRow& r = rows[t];
      const bool live = t < Q.ni;
      for (i64 d = 0; d < D; ++d) {
        r.q[d] = live ? to_f32(q[P.q + (Q.i0 + t) * L.ldq + d]) : 0.0f;
        r.dout[d] = live ? to_f32(dout[P.o + (Q.i0 + t) * L.ldo + d]) : 0.0f;
        r.dq[d] = 0.0f;
      }
      r.z = live ? lse[Q.bh * L.T + Q.i0 + t] : 0.0f;
      r.dl = live ? delta[Q.bh * L.T + Q.i0 + t] : 0.0f;
    });
    for_each_key_tile<kTile>(Q.i0, Q.ni, [&](i64 j0, i64 nj) {
      Block::phase([&](int t) {
        stage_rows<N, kTile>(t, ks, k + P.kv, L.ldkv, j0, nj, D);
        stage_rows<N, kTile>(t, vs, v + P.kv, L.ldkv, j0, nj, D);
      });
      Block::phase([&](int t) {
        if (t < Q.ni && j0 <= Q.i0 + t) dq_row_step(rows[t], ks, vs, Q.i0 + t, j0, nj, D, scale);
      });
    });
    Block::phase([&](int t) {
      if (t < Q.ni) write_dq_row(dq + P.q + (Q.i0 + t) * L.ldq, rows[t].dq, D, scale);
    });
  }
};

// The vector path runs on CPU streams where the CPU has AVX2 + FMA; elsewhere the CPU runs the
// plain functors above (tiles of kCpuAttentionTile; they may round differently, and are bitwise
// reproducible on one machine too). The dispatch below is host code, so nvcc builds (whose host
// pass is GCC) take it too: the vector path is an ordinary host function of another file.
#if defined(STP_ATTENTION_SIMD_BUILT)
#define STP_ATTENTION_SIMD 1
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

template <typename T>
void fused_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k,
                             const T* v) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH);
  row_tiles<kTile>(s, [&](auto tile) {
    using Tile = decltype(tile);
    constexpr int R = Tile::rows;
    if constexpr (Tile::host_tasks) {
#if defined(STP_ATTENTION_SIMD)
      if (simd_attention_available()) {
        simd_attention_forward(s, L, o, lse, q, k, v, scale);
        return;
      }
#endif
      launch(s, bh * tiles(L.T, R), FusedForward<T, R, R>{L, o, lse, q, k, v, scale}, 1);
    } else {
      launch(s, tile.blocks(bh * tiles(L.T, R)), FusedForwardBlock<T, Tile>{L, o, lse, q, k, v, scale}, 1);
    }
  });
}

template <typename T>
void fused_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* workspace, const T* dout,
                              const T* q, const T* k, const T* v, const T* o, const float* lse) {
  check_layout(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  const usize bh = static_cast<usize>(L.B * L.NH), bg = static_cast<usize>(L.B * L.NKV);
  float* delta = workspace;
  launch(s, bh * static_cast<usize>(L.T), FusedDelta<T>{L, delta, dout, o}, 1024);
  row_tiles<kTile>(s, [&](auto tile) {
    using Tile = decltype(tile);
    constexpr int R = Tile::rows;
    if constexpr (Tile::host_tasks) {
      // Few long tasks: one per (b, k/v head), accumulating dq in one pass (FusedBackwardCpu).
      float* dqacc = workspace + L.B * L.NH * L.T;
#if defined(STP_ATTENTION_SIMD)
      if (simd_attention_available()) {
        simd_attention_backward(s, L, dq, dk, dv, dqacc, dout, q, k, v, lse, delta, scale);
        return;
      }
#endif
      launch(s, bg, FusedBackwardCpu<T, R, R>{{L, dk, dv, dout, q, k, v, lse, delta, scale}, dq, dqacc}, 1);
    } else {
      // Many blocks: dk/dv per key tile, then dq per query tile.
      launch(s, tile.blocks(bg * tiles(L.T, R)),
             FusedBackwardKVBlock<T, Tile>{L, dk, dv, dout, q, k, v, lse, delta, scale}, 1);
      launch(s, tile.blocks(bh * tiles(L.T, R)), FusedBackwardQBlock<T, Tile>{L, dq, dout, q, k, v, lse, delta, scale},
             1);
    }
  });
}

#define STP_FUSED_ATTENTION(T)                                                                                         \
  template void fused_attention_forward<T>(Stream&, const AttentionLayout&, T*, float*, const T*, const T*, const T*); \
  template void fused_attention_backward<T>(Stream&, const AttentionLayout&, T*, T*, T*, float*, const T*, const T*,   \
                                            const T*, const T*, const T*, const float*);
STP_FUSED_ATTENTION(float)
STP_FUSED_ATTENTION(bf16)
#undef STP_FUSED_ATTENTION

}  // namespace stp
