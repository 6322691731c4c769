// The fused attention's CPU vector path (contract in attention_kernels.h, shared pieces in
// attention_tiles.h): register-blocked tile products over 8-wide vectors, for GCC host builds on
// x86-64, run on CPUs with AVX2 + FMA (attention_kernels.cpp dispatches; elsewhere, and in nvcc
// builds, the CPU runs the plain functors there). Host code only: never compiled by nvcc.
// Every tile product is one routine, tile_product(), a 4-row x 16-column block of the result kept
// in eight vector registers while the inner dimension runs in order; scores, do . v, o += p v,
// dv += pᵀ do, dk += dsᵀ q and dq += ds k are all this shape. The exponentials and the masks run
// 8 keys at a time (exp_v, the vector form of exp_nonpositive). Sums run in the same fixed orders
// as the plain functors (over d ascending, keys ascending, query rows ascending; the tile walks of
// attention_tiles.h), so the results are bitwise independent of the thread count.
#include "core/kernels/attention_tiles.h"

#if defined(STP_ATTENTION_SIMD_BUILT)

#include <atomic>
#include <cmath>
#include <vector>

#include "core/kernels/cpu_isa.h"
#include "core/kernels/simd_v8.h"
#include "core/launch.h"

namespace stp::attention_detail {
namespace {

using namespace simd_v8;  // NOLINT(google-build-using-namespace): the vector vocabulary of this file

// The 16-wide form of tile_product (below it), taken where cpu_has_isa(CpuIsa::Avx512) and the tests
// allow it (simd_attention_allow_avx512).
void tile_product_avx512(float* c, i64 ldc, i64 nrows, i64 ncols, bool acc, const float* alpha, const float* w, i64 wr,
                         i64 wk, const float* x, i64 ldx, i64 nk);

std::atomic<bool> g_allow_avx512{true};
std::atomic<bool> g_allow_simd{true};

inline bool avx512_available() { return cpu_has_isa(CpuIsa::Avx512) && g_allow_avx512.load(std::memory_order_relaxed); }

// Unaligned load and store of one vector V, and V with every lane f: the vocabulary of tile_block,
// at either width. (A byte copy: an aligned(4) typedef of V would lose its attribute as a template
// argument, and the access would assume V's own alignment.) Always inlined (simd_v8.h), so their
// code is that of the caller's target.
template <typename V>
STP_V8_INLINE V load_as(const float* q) {
  V v;
  __builtin_memcpy(&v, q, sizeof v);
  return v;
}
template <typename V>
STP_V8_INLINE void store_as(float* q, V a) {
  __builtin_memcpy(q, &a, sizeof a);
}
template <typename V>
STP_V8_INLINE V splat_as(float f) {
  return V{} + f;
}

// One 4-row block of tile_product, two vectors of V per row (4 x 16 columns at 8 lanes, 4 x 32 at
// 16), in eight accumulators over the whole k loop: c0 = row r's first column, alpha = the 4 rows'
// scales (null: 1), w0 = row r's weights, x = the block's first column. Every element is the same
// multiply-add chain over k in order at either width, so both widths give bitwise the same result.
template <typename V>
STP_V8_INLINE void tile_block(float* c0, i64 ldc, bool acc, const float* alpha, const float* w0, i64 wr, i64 wk,
                              const float* x, i64 ldx, i64 nk) {
  constexpr i64 n = sizeof(V) / sizeof(float);
  V a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};
  if (acc) {
    const V s0 = splat_as<V>(alpha ? alpha[0] : 1.0f), s1 = splat_as<V>(alpha ? alpha[1] : 1.0f);
    const V s2 = splat_as<V>(alpha ? alpha[2] : 1.0f), s3 = splat_as<V>(alpha ? alpha[3] : 1.0f);
    a00 = load_as<V>(c0) * s0, a01 = load_as<V>(c0 + n) * s0;
    a10 = load_as<V>(c0 + ldc) * s1, a11 = load_as<V>(c0 + ldc + n) * s1;
    a20 = load_as<V>(c0 + 2 * ldc) * s2, a21 = load_as<V>(c0 + 2 * ldc + n) * s2;
    a30 = load_as<V>(c0 + 3 * ldc) * s3, a31 = load_as<V>(c0 + 3 * ldc + n) * s3;
  }
  for (i64 k = 0; k < nk; ++k) {
    const V x0 = load_as<V>(x + k * ldx), x1 = load_as<V>(x + k * ldx + n);
    const float* wk0 = w0 + k * wk;
    const V b0 = splat_as<V>(wk0[0]), b1 = splat_as<V>(wk0[wr]), b2 = splat_as<V>(wk0[2 * wr]),
            b3 = splat_as<V>(wk0[3 * wr]);
    a00 += b0 * x0, a01 += b0 * x1;
    a10 += b1 * x0, a11 += b1 * x1;
    a20 += b2 * x0, a21 += b2 * x1;
    a30 += b3 * x0, a31 += b3 * x1;
  }
  store_as(c0, a00), store_as(c0 + n, a01);
  store_as(c0 + ldc, a10), store_as(c0 + ldc + n, a11);
  store_as(c0 + 2 * ldc, a20), store_as(c0 + 2 * ldc + n, a21);
  store_as(c0 + 3 * ldc, a30), store_as(c0 + 3 * ldc + n, a31);
}

// c[r][0 .. ncols) = (acc ? c[r][.] * (alpha ? alpha[r] : 1) : 0) + sum_{k < nk} w[r*wr + k*wk] * x[k*ldx + .]
// for r < nrows (a multiple of 4) and ncols a multiple of 16; k runs in order for every element.
// Each 4 x 16 block lives in eight registers over the whole k loop (tile_block; a tile array would
// be loaded and stored per k: the plain functors' bottleneck).
inline void tile_product(float* c, i64 ldc, i64 nrows, i64 ncols, bool acc, const float* alpha, const float* w, i64 wr,
                         i64 wk, const float* x, i64 ldx, i64 nk) {
  if (avx512_available()) return tile_product_avx512(c, ldc, nrows, ncols, acc, alpha, w, wr, wk, x, ldx, nk);
  for (i64 r = 0; r < nrows; r += 4)
    for (i64 cc = 0; cc < ncols; cc += 16)
      tile_block<v8>(c + r * ldc + cc, ldc, acc, alpha ? alpha + r : nullptr, w + r * wr, wr, wk, x + cc, ldx, nk);
}

// tile_product on CPUs with AVX-512F: the same products with 16-wide vectors, 4 rows x 32 columns
// per block (tile_block; a last 16 columns, when ncols is an odd multiple of 16, in four
// accumulators). Every element is the same multiply-add chain over k in the same order as the
// 8-wide form's, so the results are bitwise those of the AVX2 path; only the instructions are twice
// as wide. Not inlined into the AVX2 callers (another target): one call per tile product.
typedef float v16 __attribute__((vector_size(64)));

__attribute__((target("avx512f,fma"), noinline)) void tile_product_avx512(float* c, i64 ldc, i64 nrows, i64 ncols,
                                                                          bool acc, const float* alpha, const float* w,
                                                                          i64 wr, i64 wk, const float* x, i64 ldx,
                                                                          i64 nk) {
  for (i64 r = 0; r < nrows; r += 4) {
    const float* w0 = w + r * wr;
    const float* ar = alpha ? alpha + r : nullptr;
    i64 cc = 0;
    for (; cc + 32 <= ncols; cc += 32) tile_block<v16>(c + r * ldc + cc, ldc, acc, ar, w0, wr, wk, x + cc, ldx, nk);
    if (cc < ncols) {  // 16 columns left
      float* c0 = c + r * ldc + cc;
      v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      if (acc) {
        a0 = load_as<v16>(c0) * splat_as<v16>(ar ? ar[0] : 1.0f);
        a1 = load_as<v16>(c0 + ldc) * splat_as<v16>(ar ? ar[1] : 1.0f);
        a2 = load_as<v16>(c0 + 2 * ldc) * splat_as<v16>(ar ? ar[2] : 1.0f);
        a3 = load_as<v16>(c0 + 3 * ldc) * splat_as<v16>(ar ? ar[3] : 1.0f);
      }
      for (i64 k = 0; k < nk; ++k) {
        const v16 x0 = load_as<v16>(x + k * ldx + cc);
        const float* wk0 = w0 + k * wk;
        a0 += splat_as<v16>(wk0[0]) * x0, a1 += splat_as<v16>(wk0[wr]) * x0;
        a2 += splat_as<v16>(wk0[2 * wr]) * x0, a3 += splat_as<v16>(wk0[3 * wr]) * x0;
      }
      store_as(c0, a0), store_as(c0 + ldc, a1), store_as(c0 + 2 * ldc, a2), store_as(c0 + 3 * ldc, a3);
    }
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
    for_each_key_tile<K>(i0, ni, [&](i64 j0, i64 nj) {
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
    });
    write_query_rows(L, Q, o, lse, ob, Dp, 1, m, l);
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
    const i64 D = L.D, Dp = padded_d(D), T_ = L.T;
    const i64 b = static_cast<i64>(task) / L.NKV, g = static_cast<i64>(task) % L.NKV;
    float* acc = group_dq_accumulators(L, dqacc, b, g);
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
      for_each_query_tile<R>(L, b, g, j0, [&](i64 hh, i64 bh, const HeadPtrs& P, i64 i0, i64 ni) {
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
      });
      write_kv_rows(L, dk, dv, kv_off, j0, nj, dkb, dvb, Dp, 1, scale);
    }
    write_group_dq(L, acc, dq, b, g, scale);
  }
};

// The task bodies compiled for AVX2 + FMA, chosen at run time when the CPU has them. `flatten`
// inlines the whole body (tile products, exponentials, the tile walks, to_f32/from_f32) into the
// AVX2 function, so the 8-wide vectors become single ymm registers and the multiply-adds fused
// ones.
template <typename F>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(const F& f, usize i) {
  f(i);
}
template <typename F>
struct Avx2Task {
  F f;
  void operator()(usize i) const { run_avx2(f, i); }
};

}  // namespace

void simd_attention_allow_avx512(bool allow) { g_allow_avx512.store(allow, std::memory_order_relaxed); }

void simd_attention_allow(bool allow) { g_allow_simd.store(allow, std::memory_order_relaxed); }

bool simd_attention_available() { return g_allow_simd.load(std::memory_order_relaxed) && cpu_has_isa(CpuIsa::Avx2); }

template <typename T>
void simd_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k, const T* v,
                            float scale) {
  const usize tasks = static_cast<usize>(L.B * L.NH * ((L.T + kFwdRows - 1) / kFwdRows));
  launch(s, tasks, Avx2Task<SimdForward<T>>{{L, o, lse, q, k, v, scale}}, 1);
}

template <typename T>
void simd_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* dqacc, const T* dout,
                             const T* q, const T* k, const T* v, const float* lse, const float* delta, float scale) {
  launch(s, static_cast<usize>(L.B * L.NKV),
         Avx2Task<SimdBackward<T>>{{L, dq, dk, dv, dqacc, dout, q, k, v, lse, delta, scale}}, 1);
}

#define STP_SIMD_ATTENTION(T)                                                                                        \
  template void simd_attention_forward<T>(Stream&, const AttentionLayout&, T*, float*, const T*, const T*, const T*, \
                                          float);                                                                    \
  template void simd_attention_backward<T>(Stream&, const AttentionLayout&, T*, T*, T*, float*, const T*, const T*,  \
                                           const T*, const T*, const float*, const float*, float);
STP_SIMD_ATTENTION(float)
STP_SIMD_ATTENTION(bf16)
#undef STP_SIMD_ATTENTION

}  // namespace stp::attention_detail

#endif  // STP_ATTENTION_SIMD_BUILT
