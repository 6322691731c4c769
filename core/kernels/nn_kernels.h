// Transformer kernels, written once for both backends (core/launch.h): every function enqueues
// STP_HD functors with launch() and GEMMs with Stream::gemm on `s`, reads and writes device
// memory only, and never waits. Pointers carry their shape in a comment; all tensors are
// contiguous row-major f32 unless stated. N = rows (B*T tokens).
//
// Determinism: every reduction runs in a fixed order: a row's (norm statistics, softmax and
// cross-entropy rows, the loss mean) and a column's (bias and norm-weight gradients) in the
// canonical orders of their launch shapes (core/reduce_order.h: 32 partials, then a fixed tree),
// the others in index order inside one index of the launch. So results do not depend on the
// thread count, the grain or the backend's layout (one warp per row, one block per column group
// on a GPU). Runs are bitwise reproducible on one backend. The cross-entropy's exponential is
// exp_nonpositive (softmax_rows.h), not libm's expf.
//
// Accumulation: functions named *_accumulate add into their output (gradients accumulate over
// microbatches); the others overwrite.
//
// Precision: template parameters T / TA / TC are the storage type of activations, float or bf16
// (core/dtype.h), and every function is instantiated for both. Kernels load T into f32, compute
// and reduce in f32, and round once when they store T; GEMMs multiply and sum in f32 (GemmArgs).
// Parameters, LayerNorm statistics, losses and parameter gradients are always f32. With T = float
// the code is exactly the f32 path.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "core/dtype.h"

namespace stp {

// s.gemm (row-major, core/device.h) with the operand types taken from the pointers.
template <typename TA, typename TC>
void gemm(Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const TA* a,
          std::int64_t lda, const TA* b, std::int64_t ldb, TC* c, std::int64_t ldc, float alpha = 1.0f,
          float beta = 0.0f) {
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = static_cast<int>(m);
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.alpha = alpha;
  g.a = a;
  g.lda = static_cast<int>(lda);
  g.b = b;
  g.ldb = static_cast<int>(ldb);
  g.beta = beta;
  g.c = c;
  g.ldc = static_cast<int>(ldc);
  g.ab = dtype_of<TA>();
  g.c_type = dtype_of<TC>();
  s.gemm(g);
}

// y = x converted element by element (f32 -> bf16 rounds to nearest even).
template <typename TO, typename TI>
void convert(Stream& s, TO* y /*(n,)*/, const TI* x /*(n,)*/, std::int64_t n);

// ---- LayerNorm (eps as HF GPT-2: 1e-5) ------------------------------------------------------

// out = (x - mean) * rstd * w + b per row; saves mean and rstd (N,) for the backward.
template <typename T>
void layernorm_forward(Stream& s, T* out /*(N,C)*/, float* mean /*(N,)*/, float* rstd /*(N,)*/,
                       const float* x /*(N,C)*/, const float* w /*(C,)*/, const float* b /*(C,)*/, std::int64_t N,
                       std::int64_t C, float eps = 1e-5f);

// dx = resid + LN^T(dout): the input gradient of LayerNorm plus an optional residual gradient
// (resid may be nullptr, or alias dx).
void layernorm_backward_input(Stream& s, float* dx /*(N,C)*/, const float* resid /*(N,C) or null*/,
                              const float* dout /*(N,C)*/, const float* x /*(N,C)*/, const float* mean /*(N,)*/,
                              const float* rstd /*(N,)*/, const float* w /*(C,)*/, std::int64_t N, std::int64_t C);

// dw += sum_n dout * xhat, db += sum_n dout (per channel, rows in order).
void layernorm_backward_weight_accumulate(Stream& s, float* dw /*(C,)*/, float* db /*(C,)*/,
                                          const float* dout /*(N,C)*/, const float* x /*(N,C)*/,
                                          const float* mean /*(N,)*/, const float* rstd /*(N,)*/, std::int64_t N,
                                          std::int64_t C);

// ---- Linear layers (HF Conv1D layout: y = x @ W + b, W is (in, out)) --------------------------

// y = x @ W + bias (+ resid): the forward of a linear layer. bias and resid may be nullptr.
// resid (N,out) is added before the product (row-parallel layers fold the residual into rank
// 0's partial sum; see models/gpt2_units.h).
template <typename TA, typename TC>
void linear_forward(Stream& s, TC* y /*(N,out)*/, const TA* x /*(N,in)*/, const TA* W /*(in,out)*/,
                    const float* bias /*(out,) or null*/, const std::type_identity_t<TC>* resid /*(N,out) or null*/,
                    std::int64_t N, std::int64_t in, std::int64_t out);

// dx = dy @ W^T (overwrites dx).
template <typename TA, typename TC>
void linear_backward_input(Stream& s, TC* dx /*(N,in)*/, const TA* dy /*(N,out)*/, const TA* W /*(in,out)*/,
                           std::int64_t N, std::int64_t in, std::int64_t out);

// dW += x^T @ dy; dbias += sum_n dy (dbias may be nullptr).
template <typename TA>
void linear_backward_weight_accumulate(Stream& s, float* dW /*(in,out)*/, float* dbias /*(out,) or null*/,
                                       const TA* x /*(N,in)*/, const TA* dy /*(N,out)*/, std::int64_t N,
                                       std::int64_t in, std::int64_t out);

// db[j] += sum_n dy[n, j].
template <typename T>
void column_sum_accumulate(Stream& s, float* db /*(M,)*/, const T* dy /*(N,M)*/, std::int64_t N, std::int64_t M);

// ---- GELU (tanh approximation, HF "gelu_new") --------------------------------------------------

template <typename T>
void gelu_forward(Stream& s, T* y /*(n,)*/, const T* x /*(n,)*/, std::int64_t n);
// dx = dy * gelu'(x); dx may alias dy.
template <typename T>
void gelu_backward(Stream& s, T* dx /*(n,)*/, const T* dy /*(n,)*/, const T* x /*(n,)*/, std::int64_t n);

// ---- Elementwise ---------------------------------------------------------------------------------

// y = a + b (y may alias a or b).
void add(Stream& s, float* y /*(n,)*/, const float* a /*(n,)*/, const float* b /*(n,)*/, std::int64_t n);

// ---- Embedding (tokens are int32 stored in 4-byte elements) ----------------------------------

// out[b,t] = wte[tokens[b,t]] + wpe[t] (wpe may be nullptr: no position term). Tokens must lie in
// [0, V) (validated by the data loader).
void embedding_forward(Stream& s, float* out /*(B*T,C)*/, const std::int32_t* tokens /*(B*T,)*/,
                       const float* wte /*(V,C)*/, const float* wpe /*(>=T,C)*/, std::int64_t B, std::int64_t T,
                       std::int64_t C);

// Int32 workspace elements embedding_backward_accumulate needs: V + 1 + B*T.
std::int64_t embedding_backward_workspace(std::int64_t V, std::int64_t BT);

// dwte[v] += sum of dout rows whose token is v (rows summed in order, then added once: the
// result is dwte + (sum), independent of what dwte held); dwpe[t] += sum_b dout[b,t] (dwpe may be
// nullptr).
// workspace: embedding_backward_workspace(V, B*T) int32 elements of device memory.
void embedding_backward_accumulate(Stream& s, float* dwte /*(V,C)*/, float* dwpe /*(>=T,C)*/,
                                   const float* dout /*(B*T,C)*/, const std::int32_t* tokens /*(B*T,)*/,
                                   std::int32_t* workspace, std::int64_t B, std::int64_t T, std::int64_t C,
                                   std::int64_t V);

// ---- Causal self-attention over local heads -------------------------------------------------
// qkv rows hold [q | k | v], each NH*D wide (NH local heads of size D, head h at columns h*D).
// att (B,NH,T,T) is the softmax of the scaled, causally masked scores (zero above the diagonal).
// Tn is the sequence length T (the name T is the element type here).

template <typename T>
void attention_forward(Stream& s, T* y /*(B,T,NH*D)*/, T* att /*(B,NH,T,T)*/, const T* qkv /*(B,T,3*NH*D)*/,
                       std::int64_t B, std::int64_t Tn, std::int64_t NH, std::int64_t D);

// dqkv = gradient w.r.t. qkv (overwritten). datt: workspace (B,NH,T,T).
template <typename T>
void attention_backward(Stream& s, T* dqkv /*(B,T,3*NH*D)*/, T* datt /*(B,NH,T,T)*/, const T* dy /*(B,T,NH*D)*/,
                        const T* qkv /*(B,T,3*NH*D)*/, const T* att /*(B,NH,T,T)*/, std::int64_t B, std::int64_t Tn,
                        std::int64_t NH, std::int64_t D);

// ---- Cross-entropy (mean over tokens) -----------------------------------------------------------

// losses[n] = logsumexp(logits[n]) - logits[n, targets[n]], or 0 where targets[n] is -1 (an
// ignored target: not counted in the loss); lse[n] saved for the backward; *loss = the sum of
// losses over the N rows (in the canonical row order of core/reduce_order.h) / N. The caller that
// divides by the count of counted targets instead rescales (models/stage.h, Loss).
template <typename T>
void cross_entropy_forward(Stream& s, float* loss /*(1,)*/, float* losses /*(N,)*/, float* lse /*(N,)*/,
                           const T* logits /*(N,V)*/, const std::int32_t* targets /*(N,)*/, std::int64_t N,
                           std::int64_t V);

// The two steps of cross_entropy_forward, for a caller that computes the rows in parts (the
// chunked loss head, models/unit_common.h): losses[n] and lse[n] of N rows as above (each row on
// its own: a row's values do not depend on N), and *loss = the sum of losses[0, N) in the canonical
// row order / N. cross_entropy_forward is exactly the one and then the other.
template <typename T>
void cross_entropy_rows(Stream& s, float* losses /*(N,)*/, float* lse /*(N,)*/, const T* logits /*(N,V)*/,
                        const std::int32_t* targets /*(N,)*/, std::int64_t N, std::int64_t V);
void mean_of_rows(Stream& s, float* loss /*(1,)*/, const float* losses /*(N,)*/, std::int64_t N);

// dlogits = (softmax(logits) - onehot(targets)) * scale, in place over logits; scale =
// loss_scale / N for a mean loss. A row whose target is -1 gets dlogits 0.
template <typename T>
void cross_entropy_backward_inplace(Stream& s, T* logits /*(N,V) -> dlogits*/, const float* lse /*(N,)*/,
                                    const std::int32_t* targets /*(N,)*/, float scale, std::int64_t N, std::int64_t V);

}  // namespace stp
