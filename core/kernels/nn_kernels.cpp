// Transformer kernels (contract in nn_kernels.h). Each functor does one row, one channel or one
// element; reductions loop in index order inside that one index, which makes every result
// independent of the launch's split (see the header's determinism note).
#include "core/kernels/nn_kernels.h"

#include <cmath>

#include "core/launch.h"

namespace stp {
namespace {

using i64 = std::int64_t;
using usize = std::size_t;

// Grain for row-wise kernels: enough rows for ~16K scalar ops per CPU task.
usize row_grain(i64 row_len) { return static_cast<usize>(row_len >= 16384 ? 1 : 16384 / row_len); }

// ---- LayerNorm ---------------------------------------------------------------------------------

struct LayerNormForward {
  float* out;
  float* mean;
  float* rstd;
  const float* x;
  const float* w;
  const float* b;
  i64 C;
  float eps;
  STP_HD void operator()(usize n) const {
    const float* xr = x + n * C;
    float* o = out + n * C;
    float m = 0.0f;
    for (i64 c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
    for (i64 c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<float>(C);
    float rs = 1.0f / sqrtf(v + eps);
    for (i64 c = 0; c < C; ++c) o[c] = (xr[c] - m) * rs * w[c] + b[c];
    mean[n] = m;
    rstd[n] = rs;
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
  STP_HD void operator()(usize n) const {
    const float* d = dout + n * C;
    const float* xr = x + n * C;
    float m = mean[n], rs = rstd[n];
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (i64 c = 0; c < C; ++c) {
      float g = d[c] * w[c];
      g_mean += g;
      gx_mean += g * (xr[c] - m) * rs;
    }
    g_mean /= static_cast<float>(C);
    gx_mean /= static_cast<float>(C);
    float* o = dx + n * C;
    const float* r = resid ? resid + n * C : nullptr;
    for (i64 c = 0; c < C; ++c) {
      float v = rs * (d[c] * w[c] - g_mean - (xr[c] - m) * rs * gx_mean);
      o[c] = r ? r[c] + v : v;
    }
  }
};

struct LayerNormBackwardWeight {
  float* dw;
  float* db;
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  i64 N, C;
  STP_HD void operator()(usize c) const {
    float sw = 0.0f, sb = 0.0f;
    for (i64 n = 0; n < N; ++n) {
      float d = dout[n * C + c];
      sw += d * (x[n * C + c] - mean[n]) * rstd[n];
      sb += d;
    }
    dw[c] += sw;
    db[c] += sb;
  }
};

// ---- Linear helpers ------------------------------------------------------------------------------

// out[n, j] = bias[j] (+ resid[n, j]): the initial value the GEMM accumulates onto.
struct RowsInit {
  float* out;
  const float* bias;
  const float* resid;
  i64 M;
  STP_HD void operator()(usize n) const {
    float* o = out + n * M;
    const float* r = resid ? resid + n * M : nullptr;
    for (i64 j = 0; j < M; ++j) o[j] = (bias ? bias[j] : 0.0f) + (r ? r[j] : 0.0f);
  }
};

struct ColumnSum {
  float* db;
  const float* dy;
  i64 N, M;
  STP_HD void operator()(usize j) const {
    float acc = 0.0f;
    for (i64 n = 0; n < N; ++n) acc += dy[n * M + j];
    db[j] += acc;
  }
};

// ---- GELU ----------------------------------------------------------------------------------------

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

// 0.5 * (1 + tanh(u)) = sigmoid(2u): one expf instead of tanhf (several times cheaper on CPUs).
STP_HD inline float half_one_plus_tanh(float u) { return 1.0f / (1.0f + expf(-2.0f * u)); }

struct GeluForward {
  float* y;
  const float* x;
  STP_HD void operator()(usize i) const {
    float v = x[i];
    y[i] = v * half_one_plus_tanh(kGeluC * (v + 0.044715f * v * v * v));
  }
};

// d/dx [x * s(x)], s = 0.5 (1 + tanh(u)): s + x * u' * 2 s (1 - s)  (since tanh' = 1 - t^2 = 4 s (1 - s)).
struct GeluBackward {
  float* dx;
  const float* dy;
  const float* x;
  STP_HD void operator()(usize i) const {
    float v = x[i];
    float sg = half_one_plus_tanh(kGeluC * (v + 0.044715f * v * v * v));
    float du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (sg + v * du * 2.0f * sg * (1.0f - sg));
  }
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
    const float* p = wpe + static_cast<i64>(n % T) * C;
    float* o = out + n * C;
    for (i64 c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
};

// Stable counting sort of the rows by token: offsets (V+1,) and rows (BT,) in ascending order
// inside each bucket. One thread: BT is small next to the work it organises.
struct TokenBuckets {
  std::int32_t* offsets;
  std::int32_t* rows;
  const std::int32_t* tokens;
  i64 V, BT;
  STP_HD void operator()(usize) const {
    for (i64 v = 0; v <= V; ++v) offsets[v] = 0;
    for (i64 n = 0; n < BT; ++n) ++offsets[tokens[n] + 1];
    for (i64 v = 0; v < V; ++v) offsets[v + 1] += offsets[v];
    // rows[] is filled bucket by bucket using offsets[v] as a cursor, then the cursors are
    // shifted back so offsets[v] is again the start of bucket v.
    for (i64 n = 0; n < BT; ++n) rows[offsets[tokens[n]]++] = static_cast<std::int32_t>(n);
    for (i64 v = V; v > 0; --v) offsets[v] = offsets[v - 1];
    offsets[0] = 0;
  }
};

struct EmbeddingBackwardWte {
  float* dwte;
  const float* dout;
  const std::int32_t* offsets;
  const std::int32_t* rows;
  i64 C;
  STP_HD void operator()(usize v) const {
    i64 begin = offsets[v], end = offsets[v + 1];
    if (begin == end) return;
    for (i64 c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (i64 i = begin; i < end; ++i) acc += dout[static_cast<i64>(rows[i]) * C + c];
      dwte[static_cast<i64>(v) * C + c] += acc;
    }
  }
};

struct EmbeddingBackwardWpe {
  float* dwpe;
  const float* dout;
  i64 B, T, C;
  STP_HD void operator()(usize i) const {  // i = t * C + c
    float acc = 0.0f;
    for (i64 b = 0; b < B; ++b) acc += dout[b * T * C + static_cast<i64>(i)];
    dwpe[i] += acc;
  }
};

// ---- Attention softmax -------------------------------------------------------------------------

// Row r = (bh, t) of att: softmax over j <= t of the scaled scores already in att; zero above.
struct CausalSoftmax {
  float* att;
  i64 T;
  STP_HD void operator()(usize r) const {
    i64 t = static_cast<i64>(r) % T;
    float* a = att + r * T;
    float mx = a[0];
    for (i64 j = 1; j <= t; ++j) mx = a[j] > mx ? a[j] : mx;
    float sum = 0.0f;
    for (i64 j = 0; j <= t; ++j) {
      a[j] = expf(a[j] - mx);
      sum += a[j];
    }
    float inv = 1.0f / sum;
    for (i64 j = 0; j <= t; ++j) a[j] *= inv;
    for (i64 j = t + 1; j < T; ++j) a[j] = 0.0f;
  }
};

// In place: datt -> dscores = att * (datt - sum_j att*datt) * scale (zero above the diagonal).
struct CausalSoftmaxBackward {
  float* datt;
  const float* att;
  i64 T;
  float scale;
  STP_HD void operator()(usize r) const {
    i64 t = static_cast<i64>(r) % T;
    float* d = datt + r * T;
    const float* a = att + r * T;
    float dot = 0.0f;
    for (i64 j = 0; j <= t; ++j) dot += a[j] * d[j];
    for (i64 j = 0; j <= t; ++j) d[j] = a[j] * (d[j] - dot) * scale;
    for (i64 j = t + 1; j < T; ++j) d[j] = 0.0f;
  }
};

// ---- Cross-entropy -------------------------------------------------------------------------------

struct CrossEntropyRows {
  float* losses;
  float* lse;
  const float* logits;
  const std::int32_t* targets;
  i64 V;
  STP_HD void operator()(usize n) const {
    const float* l = logits + n * V;
    float mx = l[0];
    for (i64 v = 1; v < V; ++v) mx = l[v] > mx ? l[v] : mx;
    float sum = 0.0f;
    for (i64 v = 0; v < V; ++v) sum += expf(l[v] - mx);
    float z = mx + logf(sum);
    lse[n] = z;
    losses[n] = z - l[targets[n]];
  }
};

struct MeanOfRows {
  float* loss;
  const float* losses;
  i64 N;
  STP_HD void operator()(usize) const {
    float acc = 0.0f;
    for (i64 n = 0; n < N; ++n) acc += losses[n];
    loss[0] = acc / static_cast<float>(N);
  }
};

struct CrossEntropyBackward {
  float* logits;
  const float* lse;
  const std::int32_t* targets;
  float scale;
  i64 V;
  STP_HD void operator()(usize n) const {
    float* l = logits + n * V;
    float z = lse[n];
    for (i64 v = 0; v < V; ++v) l[v] = expf(l[v] - z) * scale;
    l[targets[n]] -= scale;
  }
};

}  // namespace

// ---- Launchers -------------------------------------------------------------------------------------

void layernorm_forward(Stream& s, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, i64 N, i64 C, float eps) {
  launch(s, static_cast<usize>(N), LayerNormForward{out, mean, rstd, x, w, b, C, eps}, row_grain(3 * C));
}

void layernorm_backward_input(Stream& s, float* dx, const float* resid, const float* dout, const float* x,
                              const float* mean, const float* rstd, const float* w, i64 N, i64 C) {
  launch(s, static_cast<usize>(N), LayerNormBackwardInput{dx, resid, dout, x, mean, rstd, w, C}, row_grain(4 * C));
}

void layernorm_backward_weight_accumulate(Stream& s, float* dw, float* db, const float* dout, const float* x,
                                          const float* mean, const float* rstd, i64 N, i64 C) {
  launch(s, static_cast<usize>(C), LayerNormBackwardWeight{dw, db, dout, x, mean, rstd, N, C}, row_grain(2 * N));
}

void linear_forward(Stream& s, float* y, const float* x, const float* W, const float* bias, const float* resid,
                    i64 N, i64 in, i64 out) {
  bool init = bias || resid;
  if (init) launch(s, static_cast<usize>(N), RowsInit{y, bias, resid, out}, row_grain(out));
  GemmArgs g;
  g.m = static_cast<int>(N);
  g.n = static_cast<int>(out);
  g.k = static_cast<int>(in);
  g.a = x;
  g.lda = static_cast<int>(in);
  g.b = W;
  g.ldb = static_cast<int>(out);
  g.beta = init ? 1.0f : 0.0f;
  g.c = y;
  g.ldc = static_cast<int>(out);
  s.gemm(g);
}

void linear_backward_input(Stream& s, float* dx, const float* dy, const float* W, i64 N, i64 in, i64 out) {
  GemmArgs g;
  g.trans_b = true;
  g.m = static_cast<int>(N);
  g.n = static_cast<int>(in);
  g.k = static_cast<int>(out);
  g.a = dy;
  g.lda = static_cast<int>(out);
  g.b = W;
  g.ldb = static_cast<int>(out);
  g.c = dx;
  g.ldc = static_cast<int>(in);
  s.gemm(g);
}

void linear_backward_weight_accumulate(Stream& s, float* dW, float* dbias, const float* x, const float* dy, i64 N,
                                       i64 in, i64 out) {
  GemmArgs g;
  g.trans_a = true;
  g.m = static_cast<int>(in);
  g.n = static_cast<int>(out);
  g.k = static_cast<int>(N);
  g.a = x;
  g.lda = static_cast<int>(in);
  g.b = dy;
  g.ldb = static_cast<int>(out);
  g.beta = 1.0f;
  g.c = dW;
  g.ldc = static_cast<int>(out);
  s.gemm(g);
  if (dbias) column_sum_accumulate(s, dbias, dy, N, out);
}

void column_sum_accumulate(Stream& s, float* db, const float* dy, i64 N, i64 M) {
  launch(s, static_cast<usize>(M), ColumnSum{db, dy, N, M}, row_grain(N));
}

void gelu_forward(Stream& s, float* y, const float* x, i64 n) {
  launch(s, static_cast<usize>(n), GeluForward{y, x}, 2048);
}

void gelu_backward(Stream& s, float* dx, const float* dy, const float* x, i64 n) {
  launch(s, static_cast<usize>(n), GeluBackward{dx, dy, x}, 2048);
}

void add(Stream& s, float* y, const float* a, const float* b, i64 n) {
  launch(s, static_cast<usize>(n), Add{y, a, b}, 16384);
}

void embedding_forward(Stream& s, float* out, const std::int32_t* tokens, const float* wte, const float* wpe, i64 B,
                       i64 T, i64 C) {
  launch(s, static_cast<usize>(B * T), EmbeddingForward{out, tokens, wte, wpe, T, C}, row_grain(C));
}

i64 embedding_backward_workspace(i64 V, i64 BT) { return V + 1 + BT; }

void embedding_backward_accumulate(Stream& s, float* dwte, float* dwpe, const float* dout,
                                   const std::int32_t* tokens, std::int32_t* workspace, i64 B, i64 T, i64 C, i64 V) {
  std::int32_t* offsets = workspace;
  std::int32_t* rows = workspace + V + 1;
  launch(s, 1, TokenBuckets{offsets, rows, tokens, V, B * T}, 1);
  // Most vocabulary entries are absent from a batch and cost one comparison each.
  launch(s, static_cast<usize>(V), EmbeddingBackwardWte{dwte, dout, offsets, rows, C}, 256);
  launch(s, static_cast<usize>(T * C), EmbeddingBackwardWpe{dwpe, dout, B, T, C}, row_grain(B));
}

// Per (batch, head): scores = q k^T / sqrt(D) and y = att v as GEMMs on strided head slices.
void attention_forward(Stream& s, float* y, float* att, const float* qkv, i64 B, i64 T, i64 NH, i64 D) {
  const i64 W = NH * D;  // local width of each of q, k, v
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (i64 b = 0; b < B; ++b) {
    for (i64 h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * 3 * W + h * D;
      float* a = att + (b * NH + h) * T * T;
      GemmArgs g;
      g.trans_b = true;
      g.m = g.n = static_cast<int>(T);
      g.k = static_cast<int>(D);
      g.alpha = scale;
      g.a = q;
      g.lda = static_cast<int>(3 * W);
      g.b = q + W;  // k
      g.ldb = static_cast<int>(3 * W);
      g.c = a;
      g.ldc = static_cast<int>(T);
      s.gemm(g);
    }
  }
  launch(s, static_cast<usize>(B * NH * T), CausalSoftmax{att, T}, row_grain(3 * T));
  for (i64 b = 0; b < B; ++b) {
    for (i64 h = 0; h < NH; ++h) {
      GemmArgs g;
      g.m = static_cast<int>(T);
      g.n = static_cast<int>(D);
      g.k = static_cast<int>(T);
      g.a = att + (b * NH + h) * T * T;
      g.lda = static_cast<int>(T);
      g.b = qkv + b * T * 3 * W + 2 * W + h * D;  // v
      g.ldb = static_cast<int>(3 * W);
      g.c = y + b * T * W + h * D;
      g.ldc = static_cast<int>(W);
      s.gemm(g);
    }
  }
}

// Per (batch, head), in order: datt = dy v^T, dv = att^T dy, dscores = softmax^T(datt) / sqrt(D),
// dq = dscores k, dk = dscores^T q.
void attention_backward(Stream& s, float* dqkv, float* datt, const float* dy, const float* qkv, const float* att,
                        i64 B, i64 T, i64 NH, i64 D) {
  const i64 W = NH * D;
  const int ti = static_cast<int>(T), di = static_cast<int>(D), w3 = static_cast<int>(3 * W);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto gemm = [&](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* bm, int ldb, float* c,
                  int ldc) {
    GemmArgs g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.lda = lda;
    g.b = bm;
    g.ldb = ldb;
    g.c = c;
    g.ldc = ldc;
    s.gemm(g);
  };
  for (i64 b = 0; b < B; ++b) {
    for (i64 h = 0; h < NH; ++h) {
      const float* dyh = dy + b * T * W + h * D;
      const float* vh = qkv + b * T * 3 * W + 2 * W + h * D;
      const float* ah = att + (b * NH + h) * T * T;
      gemm(false, true, ti, ti, di, dyh, static_cast<int>(W), vh, w3, datt + (b * NH + h) * T * T, ti);
      gemm(true, false, ti, di, ti, ah, ti, dyh, static_cast<int>(W), dqkv + b * T * 3 * W + 2 * W + h * D, w3);
    }
  }
  launch(s, static_cast<usize>(B * NH * T), CausalSoftmaxBackward{datt, att, T, scale}, row_grain(3 * T));
  for (i64 b = 0; b < B; ++b) {
    for (i64 h = 0; h < NH; ++h) {
      const float* ds = datt + (b * NH + h) * T * T;
      const float* qh = qkv + b * T * 3 * W + h * D;
      float* dq = dqkv + b * T * 3 * W + h * D;
      gemm(false, false, ti, di, ti, ds, ti, qh + W, w3, dq, w3);   // dq = ds k
      gemm(true, false, ti, di, ti, ds, ti, qh, w3, dq + W, w3);    // dk = ds^T q
    }
  }
}

void cross_entropy_forward(Stream& s, float* loss, float* losses, float* lse, const float* logits,
                           const std::int32_t* targets, i64 N, i64 V) {
  launch(s, static_cast<usize>(N), CrossEntropyRows{losses, lse, logits, targets, V}, row_grain(2 * V));
  launch(s, 1, MeanOfRows{loss, losses, N}, 1);
}

void cross_entropy_backward_inplace(Stream& s, float* logits, const float* lse, const std::int32_t* targets,
                                    float scale, i64 N, i64 V) {
  launch(s, static_cast<usize>(N), CrossEntropyBackward{logits, lse, targets, scale, V}, row_grain(V));
}

}  // namespace stp
