// Transformer kernels (contract in nn_kernels.h). Each functor does one row, one channel or one
// element, or its lane's share of one through a reduction shape (core/launch_shape.h: RowReduce,
// ColumnSlices); reductions add in the shapes' canonical orders (core/reduce_order.h), which makes
// every result independent of the launch's split (see the header's determinism note).
#include "core/kernels/nn_kernels.h"

#include <cmath>
#include <type_traits>

#include "core/kernels/activation_rows.h"
#include "core/kernels/norm_rows.h"
#include "core/kernels/softmax_rows.h"
#include "core/kernels/vocab_kernels.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

using i64 = std::int64_t;
using usize = std::size_t;
using kernel_rows::row_grain;
using kernel_rows::store_dx_row;
using kernel_rows::store_row;

// ---- LayerNorm ---------------------------------------------------------------------------------

template <typename T>
struct LayerNormForward {
  T* out;
  float* mean;
  float* rstd;
  const float* x;
  const float* w;
  const float* b;
  i64 C;
  float eps;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float* xr = x + p.row * C;
    const float m = rows.sum(p, C, [&](i64 c) { return xr[c]; }) / static_cast<float>(C);
    const float v = rows.sum(p, C, [&](i64 c) { return (xr[c] - m) * (xr[c] - m); }) / static_cast<float>(C);
    const float rs = 1.0f / sqrtf(v + eps);
    store_row(rows, p, out, C, [&](i64 c) { return (xr[c] - m) * rs * w[c] + b[c]; });
    if (rows.leader(p)) {
      mean[p.row] = m;
      rstd[p.row] = rs;
    }
  }
};

// dx = resid + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w.
struct LayerNormBackwardInput {
  float* dx;
  const float* resid;
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  const float* w;
  i64 C;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float* d = dout + p.row * C;
    const float* xr = x + p.row * C;
    const float m = mean[p.row], rs = rstd[p.row];
    const float g_mean = rows.sum(p, C, [&](i64 c) { return d[c] * w[c]; }) / static_cast<float>(C);
    const float gx_mean = rows.sum(p, C, [&](i64 c) { return d[c] * w[c] * (xr[c] - m) * rs; }) / static_cast<float>(C);
    store_dx_row(rows, p, dx, resid, C,
                 [&](i64 c) { return rs * (d[c] * w[c] - g_mean - (xr[c] - m) * rs * gx_mean); });
  }
};

// dw[c] += sum_n dout * xhat, db[c] += sum_n dout: a column-sum launch over C channels of N rows.
struct LayerNormBackwardWeight {
  float* dw;
  float* db;
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  ColumnSlices cols;
  STP_HD void operator()(usize task) const {
    const i64 C = cols.columns;
    cols.reduce<2>(
        task,
        [&](i64 n, i64 c, float(&v)[2]) {
          const float d = dout[n * C + c];
          v[0] = d * (x[n * C + c] - mean[n]) * rstd[n];
          v[1] = d;
        },
        [&](i64 c, const float(&total)[2]) {
          dw[c] += total[0];
          db[c] += total[1];
        });
  }
};

// ---- Linear helpers ------------------------------------------------------------------------------

// out[n, j] = bias[j] (+ resid[n, j]): the initial value the GEMM accumulates onto.
template <typename T>
struct RowsInit {
  T* out;
  const float* bias;
  const T* resid;
  i64 M;
  STP_HD void operator()(usize n) const {
    T* o = out + n * M;
    const T* r = resid ? resid + n * M : nullptr;
    for (i64 j = 0; j < M; ++j) o[j] = from_f32<T>((bias ? bias[j] : 0.0f) + (r ? to_f32(r[j]) : 0.0f));
  }
};

// out += bias + resid per row, summed in f32 and rounded once to T (bias and resid may be null).
template <typename T>
struct RowsAdd {
  T* out;
  const float* bias;
  const T* resid;
  i64 M;
  STP_HD void operator()(usize n) const {
    T* o = out + n * M;
    const T* r = resid ? resid + n * M : nullptr;
    for (i64 j = 0; j < M; ++j) o[j] = from_f32<T>(to_f32(o[j]) + (bias ? bias[j] : 0.0f) + (r ? to_f32(r[j]) : 0.0f));
  }
};

// db[j] += sum_n dy[n, j]: a column-sum launch over M columns of N rows.
template <typename T>
struct ColumnSum {
  float* db;
  const T* dy;
  ColumnSlices cols;
  STP_HD void operator()(usize task) const {
    const i64 M = cols.columns;
    cols.reduce<1>(
        task, [&](i64 n, i64 j, float(&v)[1]) { v[0] = to_f32(dy[n * M + j]); },
        [&](i64 j, const float(&total)[1]) { db[j] += total[0]; });
  }
};

// ---- GELU ----------------------------------------------------------------------------------------

// One task per run of contiguous elements (an element-wise launch, activation_rows.h): a CPU run
// of kActivationRun is long enough for the 8-wide form. Elements are independent, so the split
// never changes a result.
constexpr i64 kActivationRun = 1024;

template <typename T>
struct GeluForward {
  T* y;
  const T* x;
  ElementRuns runs;
  STP_HD void operator()(usize r) const {
    const auto [begin, size] = runs.part(r);
    activation_rows::gelu_run(y + begin, x + begin, size);
  }
};

template <typename T>
struct GeluBackward {
  T* dx;
  const T* dy;
  const T* x;
  ElementRuns runs;
  STP_HD void operator()(usize r) const {
    const auto [begin, size] = runs.part(r);
    activation_rows::gelu_backward_run(dx + begin, dy + begin, x + begin, size);
  }
};

template <typename TO, typename TI>
struct Convert {
  TO* y;
  const TI* x;
  STP_HD void operator()(usize i) const { y[i] = from_f32<TO>(to_f32(x[i])); }
};

struct Add {
  float* y;
  const float* a;
  const float* b;
  STP_HD void operator()(usize i) const { y[i] = a[i] + b[i]; }
};

// ---- Embedding -----------------------------------------------------------------------------------

struct EmbeddingForward {
  float* out;
  const std::int32_t* tokens;
  const float* wte;
  const float* wpe;
  i64 T, C;
  STP_HD void operator()(usize n) const {
    const float* e = wte + static_cast<i64>(tokens[n]) * C;
    float* o = out + n * C;
    if (wpe == nullptr) {  // no learned positions (rotary models)
      for (i64 c = 0; c < C; ++c) o[c] = e[c];
      return;
    }
    const float* p = wpe + static_cast<i64>(n % T) * C;
    for (i64 c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
};

// ---- Attention softmax -------------------------------------------------------------------------

// Row r = (bh, t) of att: softmax over j <= t of the scaled scores already in att; zero above.
// With bf16 storage the exponentials are recomputed for the normalisation rather than stored
// unnormalised (the sum must see f32 values, and the row is stored once, rounded).
template <typename T>
struct CausalSoftmax {
  T* att;
  i64 T_;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const i64 t = p.row % T_;
    T* a = att + p.row * T_;
    const float mx = rows.max(p, t + 1, [&](i64 j) { return to_f32(a[j]); });
    if constexpr (dtype_of<T>() == DType::F32) {
      const float sum = rows.sum(p, t + 1, [&](i64 j) {
        a[j] = expf(a[j] - mx);
        return a[j];
      });
      const float inv = 1.0f / sum;
      rows.each(p, t + 1, [&](i64 j) { a[j] *= inv; });
    } else {
      const float sum = rows.sum(p, t + 1, [&](i64 j) { return expf(to_f32(a[j]) - mx); });
      const float inv = 1.0f / sum;
      rows.each(p, t + 1, [&](i64 j) { a[j] = from_f32<T>(expf(to_f32(a[j]) - mx) * inv); });
    }
    rows.each(p, T_ - t - 1, [&](i64 j) { a[t + 1 + j] = from_f32<T>(0.0f); });
  }
};

// In place: datt -> dscores = att * (datt - sum_j att*datt) * scale (zero above the diagonal).
template <typename T>
struct CausalSoftmaxBackward {
  T* datt;
  const T* att;
  i64 T_;
  float scale;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const i64 t = p.row % T_;
    T* d = datt + p.row * T_;
    const T* a = att + p.row * T_;
    const float dot = rows.sum(p, t + 1, [&](i64 j) { return to_f32(a[j]) * to_f32(d[j]); });
    rows.each(p, t + 1, [&](i64 j) { d[j] = from_f32<T>(to_f32(a[j]) * (to_f32(d[j]) - dot) * scale); });
    rows.each(p, T_ - t - 1, [&](i64 j) { d[t + 1 + j] = from_f32<T>(0.0f); });
  }
};

// ---- Cross-entropy -------------------------------------------------------------------------------

template <typename T>
struct CrossEntropyRows {
  float* losses;
  float* lse;
  const T* logits;
  const std::int32_t* targets;
  i64 V;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const T* l = logits + p.row * V;
    const float mx = softmax_rows::row_max(rows, p, l, V);
    const float z = mx + logf(softmax_rows::row_sum_exp(rows, p, l, V, mx));
    if (rows.leader(p)) {
      lse[p.row] = z;
      const std::int32_t target = targets[p.row];
      losses[p.row] = target >= 0 ? z - to_f32(l[target]) : 0.0f;  // an ignored target (-1) counts 0
    }
  }
};

// loss = mean of the N row losses: one row of N, reduced in the canonical row order.
struct MeanOfRows {
  float* loss;
  const float* losses;
  i64 N;
  RowReduce rows;  // one row
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float acc = rows.sum(p, N, [&](i64 n) { return losses[n]; });
    if (rows.leader(p)) loss[0] = acc / static_cast<float>(N);
  }
};

}  // namespace

// ---- Launchers -------------------------------------------------------------------------------------

template <typename TO, typename TI>
void convert(Stream& s, TO* y, const TI* x, i64 n) {
  launch(s, static_cast<usize>(n), Convert<TO, TI>{y, x}, 16384);
}

template <typename T>
void layernorm_forward(Stream& s, T* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       i64 N, i64 C, float eps) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, LayerNormForward<T>{out, mean, rstd, x, w, b, C, eps, rows}, row_grain(3 * C));
}

void layernorm_backward_input(Stream& s, float* dx, const float* resid, const float* dout, const float* x,
                              const float* mean, const float* rstd, const float* w, i64 N, i64 C) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, LayerNormBackwardInput{dx, resid, dout, x, mean, rstd, w, C, rows}, row_grain(4 * C));
}

void layernorm_backward_weight_accumulate(Stream& s, float* dw, float* db, const float* dout, const float* x,
                                          const float* mean, const float* rstd, i64 N, i64 C) {
  const ColumnSlices cols = column_sums(s, C, N);
  launch(s, cols, LayerNormBackwardWeight{dw, db, dout, x, mean, rstd, cols},
         row_grain(2 * N * ColumnSlices::kCpuWidth));
}

template <typename TA, typename TC>
void linear_forward(Stream& s, TC* y, const TA* x, const TA* W, const float* bias,
                    const std::type_identity_t<TC>* resid, i64 N, i64 in, i64 out) {
  bool init = bias || resid;
  if constexpr (std::is_same_v<TC, float>) {
    if (init) launch(s, static_cast<usize>(N), RowsInit<TC>{y, bias, resid, out}, row_grain(out));
    gemm(s, false, false, N, out, in, x, in, W, out, y, out, 1.0f, init ? 1.0f : 0.0f);
  } else {
    // A reduced-precision output takes no C from the GEMM: cuBLAS rounds x·W to the output type
    // before it adds beta·C (measured on an H200: 4-ulp errors where x·W and the bias nearly cancel),
    // which no CPU GEMM does. So both backends round x·W once, then add bias and resid here in f32.
    gemm(s, false, false, N, out, in, x, in, W, out, y, out, 1.0f, 0.0f);
    if (init) launch(s, static_cast<usize>(N), RowsAdd<TC>{y, bias, resid, out}, row_grain(out));
  }
}

template <typename TA, typename TC>
void linear_backward_input(Stream& s, TC* dx, const TA* dy, const TA* W, i64 N, i64 in, i64 out) {
  gemm(s, false, true, N, in, out, dy, out, W, out, dx, in);
}

template <typename TA>
void linear_backward_weight_accumulate(Stream& s, float* dW, float* dbias, const TA* x, const TA* dy, i64 N, i64 in,
                                       i64 out) {
  gemm(s, true, false, in, out, N, x, in, dy, out, dW, out, 1.0f, 1.0f);
  if (dbias) column_sum_accumulate(s, dbias, dy, N, out);
}

template <typename T>
void column_sum_accumulate(Stream& s, float* db, const T* dy, i64 N, i64 M) {
  const ColumnSlices cols = column_sums(s, M, N);
  launch(s, cols, ColumnSum<T>{db, dy, cols}, row_grain(N * ColumnSlices::kCpuWidth));
}

template <typename T>
void gelu_forward(Stream& s, T* y, const T* x, i64 n) {
  const ElementRuns runs = element_wise(s, n, kActivationRun);
  launch(s, runs, GeluForward<T>{y, x, runs}, runs.grain(2048));
}

template <typename T>
void gelu_backward(Stream& s, T* dx, const T* dy, const T* x, i64 n) {
  const ElementRuns runs = element_wise(s, n, kActivationRun);
  launch(s, runs, GeluBackward<T>{dx, dy, x, runs}, runs.grain(2048));
}

void add(Stream& s, float* y, const float* a, const float* b, i64 n) {
  launch(s, static_cast<usize>(n), Add{y, a, b}, 16384);
}

void embedding_forward(Stream& s, float* out, const std::int32_t* tokens, const float* wte, const float* wpe, i64 B,
                       i64 T, i64 C) {
  launch(s, static_cast<usize>(B * T), EmbeddingForward{out, tokens, wte, wpe, T, C}, row_grain(C));
}

i64 embedding_backward_workspace(i64 V, i64 BT) { return V + 1 + BT; }

void embedding_backward_accumulate(Stream& s, float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                   std::int32_t* workspace, i64 B, i64 T, i64 C, i64 V) {
  // The replicated table is the vocab-parallel shard that holds every row: the same buckets and
  // the same sums, in the same order.
  vocab_embedding_backward_accumulate(s, dwte, dwpe, dout, tokens, workspace, B, T, C, 0, V);
}

// Per (batch, head): scores = q k^T / sqrt(D) and y = att v as GEMMs on strided head slices.
template <typename T>
void attention_forward(Stream& s, T* y, T* att, const T* qkv, i64 B, i64 Tn, i64 NH, i64 D) {
  const i64 W = NH * D;  // local width of each of q, k, v
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < NH; ++h) {
      const T* q = qkv + b * Tn * 3 * W + h * D;
      gemm(s, false, true, Tn, Tn, D, q, 3 * W, q + W /*k*/, 3 * W, att + (b * NH + h) * Tn * Tn, Tn, scale);
    }
  const RowReduce rows = row_reduce(s, B * NH * Tn);
  launch(s, rows, CausalSoftmax<T>{att, Tn, rows}, row_grain(3 * Tn));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < NH; ++h) {
      const T* v = qkv + b * Tn * 3 * W + 2 * W + h * D;
      gemm(s, false, false, Tn, D, Tn, att + (b * NH + h) * Tn * Tn, Tn, v, 3 * W, y + b * Tn * W + h * D, W);
    }
}

// Per (batch, head), in order: datt = dy v^T, dv = att^T dy, dscores = softmax^T(datt) / sqrt(D),
// dq = dscores k, dk = dscores^T q.
template <typename T>
void attention_backward(Stream& s, T* dqkv, T* datt, const T* dy, const T* qkv, const T* att, i64 B, i64 Tn, i64 NH,
                        i64 D) {
  const i64 W = NH * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < NH; ++h) {
      const T* dyh = dy + b * Tn * W + h * D;
      const T* vh = qkv + b * Tn * 3 * W + 2 * W + h * D;
      const T* ah = att + (b * NH + h) * Tn * Tn;
      gemm(s, false, true, Tn, Tn, D, dyh, W, vh, 3 * W, datt + (b * NH + h) * Tn * Tn, Tn);
      gemm(s, true, false, Tn, D, Tn, ah, Tn, dyh, W, dqkv + b * Tn * 3 * W + 2 * W + h * D, 3 * W);
    }
  const RowReduce rows = row_reduce(s, B * NH * Tn);
  launch(s, rows, CausalSoftmaxBackward<T>{datt, att, Tn, scale, rows}, row_grain(3 * Tn));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < NH; ++h) {
      const T* ds = datt + (b * NH + h) * Tn * Tn;
      const T* qh = qkv + b * Tn * 3 * W + h * D;
      T* dq = dqkv + b * Tn * 3 * W + h * D;
      gemm(s, false, false, Tn, D, Tn, ds, Tn, qh + W, 3 * W, dq, 3 * W);  // dq = ds k
      gemm(s, true, false, Tn, D, Tn, ds, Tn, qh, 3 * W, dq + W, 3 * W);   // dk = ds^T q
    }
}

template <typename T>
void cross_entropy_rows(Stream& s, float* losses, float* lse, const T* logits, const std::int32_t* targets, i64 N,
                        i64 V) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, CrossEntropyRows<T>{losses, lse, logits, targets, V, rows}, row_grain(2 * V));
}

void mean_of_rows(Stream& s, float* loss, const float* losses, i64 N) {
  const RowReduce one = row_reduce(s, 1);
  launch(s, one, MeanOfRows{loss, losses, N, one}, 1);
}

template <typename T>
void cross_entropy_forward(Stream& s, float* loss, float* losses, float* lse, const T* logits,
                           const std::int32_t* targets, i64 N, i64 V) {
  cross_entropy_rows(s, losses, lse, logits, targets, N, V);
  mean_of_rows(s, loss, losses, N);
}

template <typename T>
void cross_entropy_backward_inplace(Stream& s, T* logits, const float* lse, const std::int32_t* targets, float scale,
                                    i64 N, i64 V) {
  // The replicated row is the vocab-parallel shard that holds every column and no padding: the
  // same tasks, each entry the same expression.
  vocab_ce_backward_inplace(s, logits, lse, targets, scale, N, V, V, 0);
}

// ---- Instantiations: f32, and bf16 activations (with f32 where a result feeds an f32 tensor) ---------

#define STP_PER_ACTIVATION_TYPE(T)                                                                                    \
  template void layernorm_forward<T>(Stream&, T*, float*, float*, const float*, const float*, const float*, i64, i64, \
                                     float);                                                                          \
  template void linear_forward<T, T>(Stream&, T*, const T*, const T*, const float*, const T*, i64, i64, i64);         \
  template void linear_backward_input<T, T>(Stream&, T*, const T*, const T*, i64, i64, i64);                          \
  template void linear_backward_weight_accumulate<T>(Stream&, float*, float*, const T*, const T*, i64, i64, i64);     \
  template void column_sum_accumulate<T>(Stream&, float*, const T*, i64, i64);                                        \
  template void gelu_forward<T>(Stream&, T*, const T*, i64);                                                          \
  template void gelu_backward<T>(Stream&, T*, const T*, const T*, i64);                                               \
  template void attention_forward<T>(Stream&, T*, T*, const T*, i64, i64, i64, i64);                                  \
  template void attention_backward<T>(Stream&, T*, T*, const T*, const T*, const T*, i64, i64, i64, i64);             \
  template void cross_entropy_forward<T>(Stream&, float*, float*, float*, const T*, const std::int32_t*, i64, i64);   \
  template void cross_entropy_rows<T>(Stream&, float*, float*, const T*, const std::int32_t*, i64, i64);              \
  template void cross_entropy_backward_inplace<T>(Stream&, T*, const float*, const std::int32_t*, float, i64, i64);
STP_PER_ACTIVATION_TYPE(float)
STP_PER_ACTIVATION_TYPE(bf16)
#undef STP_PER_ACTIVATION_TYPE

// Row-parallel outputs and partial input gradients are f32 (they are all-reduced and added to the
// f32 residual stream); their inputs are bf16.
template void linear_forward<bf16, float>(Stream&, float*, const bf16*, const bf16*, const float*, const float*, i64,
                                          i64, i64);
template void linear_backward_input<bf16, float>(Stream&, float*, const bf16*, const bf16*, i64, i64, i64);
template void convert<bf16, float>(Stream&, bf16*, const float*, i64);
template void convert<float, bf16>(Stream&, float*, const bf16*, i64);

}  // namespace stp
