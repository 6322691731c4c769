// Llama-family kernels (contract in llama_kernels.h). Each functor does one row or one channel,
// or its lane's share of one through a reduction shape (core/launch_shape.h: RowReduce,
// ColumnSlices); reductions add in the shapes' canonical orders (core/reduce_order.h).
#include "core/kernels/llama_kernels.h"

#include <algorithm>
#include <cmath>

#include "core/kernels/activation_rows.h"
#include "core/kernels/norm_rows.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

using i64 = std::int64_t;
using usize = std::size_t;
using kernel_rows::row_grain;
using kernel_rows::store_dx_row;
using kernel_rows::store_row;

// ---- RMSNorm -----------------------------------------------------------------------------------

template <typename T>
struct RmsNormForward {
  T* out;
  float* rstd;
  const float* x;
  const float* w;
  i64 C;
  float eps;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float* xr = x + p.row * C;
    const float ss = rows.sum(p, C, [&](i64 c) { return xr[c] * xr[c]; });
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
    store_row(rows, p, out, C, [&](i64 c) { return xr[c] * rs * w[c]; });
    if (rows.leader(p)) rstd[p.row] = rs;
  }
};

struct RmsNormBackwardInput {
  float* dx;
  const float* resid;
  const float* dout;
  const float* x;
  const float* rstd;
  const float* w;
  i64 C;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float* d = dout + p.row * C;
    const float* xr = x + p.row * C;
    const float rs = rstd[p.row];
    // the mean of g * xhat
    const float dot = rows.sum(p, C, [&](i64 c) { return d[c] * w[c] * (xr[c] * rs); }) / static_cast<float>(C);
    store_dx_row(rows, p, dx, resid, C, [&](i64 c) { return rs * (d[c] * w[c] - xr[c] * rs * dot); });
  }
};

// dw[c] += sum_n dout * xhat: a column-sum launch over C channels of N rows.
struct RmsNormBackwardWeight {
  float* dw;
  const float* dout;
  const float* x;
  const float* rstd;
  ColumnSlices cols;
  STP_HD void operator()(usize task) const {
    const i64 C = cols.columns;
    cols.reduce<1>(
        task, [&](i64 n, i64 c, float(&v)[1]) { v[0] = dout[n * C + c] * (x[n * C + c] * rstd[n]); },
        [&](i64 c, const float(&total)[1]) { dw[c] += total[0]; });
  }
};

// ---- RoPE ---------------------------------------------------------------------------------------

// One task per (position t, pair i): the angle's cos and sin are computed once and applied to
// every row at position t (n = t, t + Tn, ...) and every head, so the double-precision pow, cos
// and sin run Tn * D/2 times per call rather than N * heads * D/2 times. Each element's value is
// the same expression of the same operands, whatever the split.
template <typename T>
struct Rope {
  T* x;
  i64 N, Tn, ld, heads, D;
  double theta;
  double sign;  // +1 forward, -1 backward (the transpose rotation)
  STP_HD void operator()(usize task) const {
    const i64 half = D / 2;
    const i64 t = static_cast<i64>(task) / half, i = static_cast<i64>(task) % half;
    const double a = static_cast<double>(t) * ::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const float c = static_cast<float>(::cos(a)), sn = static_cast<float>(sign * ::sin(a));
    for (i64 n = t; n < N; n += Tn)
      for (i64 h = 0; h < heads; ++h) {
        T* r = x + n * ld + h * D;
        const float x1 = to_f32(r[i]), x2 = to_f32(r[i + half]);
        r[i] = from_f32<T>(x1 * c - x2 * sn);
        r[i + half] = from_f32<T>(x2 * c + x1 * sn);
      }
  }
};

// ---- SwiGLU --------------------------------------------------------------------------------------

// h row n = [gate (F) | up (F)] -> y row n (F); the formulas are activation_rows.h's. One task per
// segment of a row's F outputs (a row-wise launch).
template <typename T>
struct SwigluForward {
  T* y;
  const T* h;
  RowSegments seg;  // over F
  STP_HD void operator()(usize i) const {
    const auto [n, j0, len] = seg.part(i);
    const i64 F = seg.len;
    const T* g = h + n * 2 * F + j0;
    activation_rows::swiglu_run(y + n * F + j0, g, g + F, len);
  }
};

template <typename T>
struct SwigluBackward {
  T* dh;
  const T* dy;
  const T* h;
  RowSegments seg;  // over F
  STP_HD void operator()(usize i) const {
    const auto [n, j0, len] = seg.part(i);
    const i64 F = seg.len;
    const T* g = h + n * 2 * F + j0;
    T* dg = dh + n * 2 * F + j0;
    activation_rows::swiglu_backward_run(dg, dg + F, dy + n * F + j0, g, g + F, len);
  }
};

// ---- GQA expand / reduce -------------------------------------------------------------------------

// A row of q (H heads), k and v (K kv-heads each) of D values; the full row repeats each kv-head
// for the H / K query heads of its group. A row-wise launch: a task takes the whole row (count 1:
// the CPU layout) or one output element (the GPU layout), located by index arithmetic.
// The per-element and the row walks share the expressions below: a copy (expand) or the same group
// sum in the same order (reduce), so the values do not depend on the split.
struct GqaShape {
  i64 H, K, D;
  // Index in the compact row of kv part (1: k, 2: v), kv-head of query head h, element e.
  STP_HD i64 kv_index(i64 part, i64 h, i64 e) const { return H * D + (part - 1) * K * D + (h / (H / K)) * D + e; }
  // Sum over the group of kv-head j, part (1: k, 2: v), element e of a full row, in head order.
  template <typename T>
  STP_HD float group_sum(const T* full, i64 part, i64 j, i64 e) const {
    const i64 group = H / K;
    float acc = 0.0f;
    for (i64 g = 0; g < group; ++g) acc += to_f32(full[part * H * D + (j * group + g) * D + e]);
    return acc;
  }
};

template <typename T>
struct GqaExpand {
  T* out;
  const T* qkv;
  GqaShape q;
  RowSegments seg;  // over 3 H D
  STP_HD void operator()(usize i) const {
    const RowSegments::Part p = seg.part(i);
    const i64 H = q.H, D = q.D, n = p.row;
    const T* in = qkv + n * (H + 2 * q.K) * D;
    T* o = out + n * 3 * H * D;
    if (seg.count > 1) {  // one element
      const i64 c = p.begin;
      o[c] = in[c < H * D ? c : q.kv_index(c / (H * D), c % (H * D) / D, c % D)];
      return;
    }
    for (i64 c = 0; c < H * D; ++c) o[c] = in[c];
    for (int part = 1; part <= 2; ++part)  // k, then v
      for (i64 h = 0; h < H; ++h)
        for (i64 e = 0; e < D; ++e) o[part * H * D + h * D + e] = in[q.kv_index(part, h, e)];
  }
};

template <typename T>
struct GqaReduce {
  T* dqkv;
  const T* dfull;
  GqaShape q;
  RowSegments seg;  // over (H + 2 K) D
  STP_HD void operator()(usize i) const {
    const RowSegments::Part p = seg.part(i);
    const i64 H = q.H, K = q.K, D = q.D, n = p.row;
    const T* in = dfull + n * 3 * H * D;
    T* o = dqkv + n * (H + 2 * K) * D;
    if (seg.count > 1) {  // one element
      const i64 c = p.begin, kv = c - H * D;
      o[c] = c < H * D ? in[c] : from_f32<T>(q.group_sum(in, 1 + kv / (K * D), kv % (K * D) / D, c % D));
      return;
    }
    for (i64 c = 0; c < H * D; ++c) o[c] = in[c];
    for (int part = 1; part <= 2; ++part)
      for (i64 j = 0; j < K; ++j)
        for (i64 e = 0; e < D; ++e)
          o[H * D + (part - 1) * K * D + j * D + e] = from_f32<T>(q.group_sum(in, part, j, e));
  }
};

// Rope tasks per CPU grain: ~16K scalar ops, a task rotating (N / Tn) * heads pairs (~8 ops each)
// after its angle (~100 ops of pow, cos and sin).
usize rope_grain(i64 N, i64 Tn, i64 heads) {
  const i64 per_task = 100 + 8 * heads * ((N + Tn - 1) / Tn);
  return static_cast<usize>(per_task >= 16384 ? 1 : 16384 / per_task);
}

}  // namespace

template <typename T>
void rmsnorm_forward(Stream& s, T* out, float* rstd, const float* x, const float* w, i64 N, i64 C, float eps) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, RmsNormForward<T>{out, rstd, x, w, C, eps, rows}, row_grain(C));
}

void rmsnorm_backward_input(Stream& s, float* dx, const float* resid, const float* dout, const float* x,
                            const float* rstd, const float* w, i64 N, i64 C) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, RmsNormBackwardInput{dx, resid, dout, x, rstd, w, C, rows}, row_grain(C));
}

void rmsnorm_backward_weight_accumulate(Stream& s, float* dw, const float* dout, const float* x, const float* rstd,
                                        i64 N, i64 C) {
  const ColumnSlices cols = column_sums(s, C, N);
  launch(s, cols, RmsNormBackwardWeight{dw, dout, x, rstd, cols}, row_grain(N * ColumnSlices::kCpuWidth));
}

template <typename T>
void rope_forward(Stream& s, T* x, i64 N, i64 Tn, i64 ld, i64 heads, i64 D, double theta) {
  launch(s, static_cast<usize>(std::min(N, Tn) * (D / 2)), Rope<T>{x, N, Tn, ld, heads, D, theta, 1.0},
         rope_grain(N, Tn, heads));
}

template <typename T>
void rope_backward(Stream& s, T* dx, i64 N, i64 Tn, i64 ld, i64 heads, i64 D, double theta) {
  launch(s, static_cast<usize>(std::min(N, Tn) * (D / 2)), Rope<T>{dx, N, Tn, ld, heads, D, theta, -1.0},
         rope_grain(N, Tn, heads));
}

template <typename T>
void swiglu_forward(Stream& s, T* y, const T* h, i64 N, i64 F) {
  const RowSegments seg = row_wise(s, N, F);
  launch(s, seg, SwigluForward<T>{y, h, seg}, row_grain(4 * F));
}

template <typename T>
void swiglu_backward(Stream& s, T* dh, const T* dy, const T* h, i64 N, i64 F) {
  const RowSegments seg = row_wise(s, N, F);
  launch(s, seg, SwigluBackward<T>{dh, dy, h, seg}, row_grain(8 * F));
}

template <typename T>
void gqa_expand(Stream& s, T* out, const T* qkv, i64 N, i64 H, i64 K, i64 D) {
  const RowSegments seg = row_wise(s, N, 3 * H * D);
  launch(s, seg, GqaExpand<T>{out, qkv, {H, K, D}, seg}, row_grain(3 * H * D));
}

template <typename T>
void gqa_reduce(Stream& s, T* dqkv, const T* dfull, i64 N, i64 H, i64 K, i64 D) {
  const RowSegments seg = row_wise(s, N, (H + 2 * K) * D);
  launch(s, seg, GqaReduce<T>{dqkv, dfull, {H, K, D}, seg}, row_grain(3 * H * D));
}

#define STP_PER_ACTIVATION_TYPE(T)                                                                    \
  template void rmsnorm_forward<T>(Stream&, T*, float*, const float*, const float*, i64, i64, float); \
  template void rope_forward<T>(Stream&, T*, i64, i64, i64, i64, i64, double);                        \
  template void rope_backward<T>(Stream&, T*, i64, i64, i64, i64, i64, double);                       \
  template void swiglu_forward<T>(Stream&, T*, const T*, i64, i64);                                   \
  template void swiglu_backward<T>(Stream&, T*, const T*, const T*, i64, i64);                        \
  template void gqa_expand<T>(Stream&, T*, const T*, i64, i64, i64, i64);                             \
  template void gqa_reduce<T>(Stream&, T*, const T*, i64, i64, i64, i64);
STP_PER_ACTIVATION_TYPE(float)
STP_PER_ACTIVATION_TYPE(bf16)
#undef STP_PER_ACTIVATION_TYPE

}  // namespace stp
