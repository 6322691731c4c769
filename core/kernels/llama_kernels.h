// Kernels of Llama-family blocks (models/llama_units.h), written once for both backends
// (core/launch.h), under the rules of nn_kernels.h: device memory only, never waits, every
// reduction in a fixed order (RMSNorm rows and weight-gradient columns in the canonical orders of
// core/reduce_order.h; bitwise reproducible on one backend), activations T = float or bf16 loaded into f32 and rounded once when stored, weights,
// statistics and weight gradients f32. N = rows (B*T tokens).
#pragma once

#include <cstdint>

#include "core/device.h"

namespace stp {

// ---- RMSNorm (HF LlamaRMSNorm) ---------------------------------------------------------------

// out = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd (N,) for the backward.
template <typename T>
void rmsnorm_forward(Stream& s, T* out /*(N,C)*/, float* rstd /*(N,)*/, const float* x /*(N,C)*/,
                     const float* w /*(C,)*/, std::int64_t N, std::int64_t C, float eps);

// dx = resid + rstd * (g - xhat * mean(g * xhat)), g = dout * w, xhat = x * rstd: the input
// gradient plus an optional residual gradient (resid may be nullptr, or alias dx).
void rmsnorm_backward_input(Stream& s, float* dx /*(N,C)*/, const float* resid /*(N,C) or null*/,
                            const float* dout /*(N,C)*/, const float* x /*(N,C)*/, const float* rstd /*(N,)*/,
                            const float* w /*(C,)*/, std::int64_t N, std::int64_t C);

// dw += sum_n dout * xhat (per channel, rows in order).
void rmsnorm_backward_weight_accumulate(Stream& s, float* dw /*(C,)*/, const float* dout /*(N,C)*/,
                                        const float* x /*(N,C)*/, const float* rstd /*(N,)*/, std::int64_t N,
                                        std::int64_t C);

// ---- Rotary position embedding (HF rotate-half convention) ------------------------------------

// In place over `heads` heads of D (D even) at the start of each row of x (row stride ld): for
// row n at position t = n mod Tn and i < D/2, with a = t * theta^(-2i/D) (computed in double):
//   x[i]       <- x[i] cos a - x[i + D/2] sin a
//   x[i + D/2] <- x[i + D/2] cos a + x[i] sin a
// rope_backward applies the transpose (the rotation by -a): the input gradient from the output's.
template <typename T>
void rope_forward(Stream& s, T* x /*(N, ld)*/, std::int64_t N, std::int64_t Tn, std::int64_t ld, std::int64_t heads,
                  std::int64_t D, double theta);
template <typename T>
void rope_backward(Stream& s, T* dx /*(N, ld)*/, std::int64_t N, std::int64_t Tn, std::int64_t ld, std::int64_t heads,
                   std::int64_t D, double theta);

// ---- SwiGLU (HF LlamaMLP: down(silu(gate(x)) * up(x))) -----------------------------------------

// h rows hold [gate | up], each F wide: y = silu(gate) * up.
template <typename T>
void swiglu_forward(Stream& s, T* y /*(N,F)*/, const T* h /*(N,2F)*/, std::int64_t N, std::int64_t F);
// dh = [dy * up * silu'(gate) | dy * silu(gate)] (overwritten).
template <typename T>
void swiglu_backward(Stream& s, T* dh /*(N,2F)*/, const T* dy /*(N,F)*/, const T* h /*(N,2F)*/, std::int64_t N,
                     std::int64_t F);

// ---- Grouped-query attention for the naive kernel --------------------------------------------

// qkv rows hold [q | k | v]: H query heads, then K key heads and K value heads, each of D
// (H a multiple of K). gqa_expand writes [q | k' | v'] with H heads each, head h of k' and v'
// being head h / (H / K) of k and v: the layout attention_forward (nn_kernels.h) reads.
template <typename T>
void gqa_expand(Stream& s, T* out /*(N, 3HD)*/, const T* qkv /*(N, (H+2K)D)*/, std::int64_t N, std::int64_t H,
                std::int64_t K, std::int64_t D);
// The transpose: dqkv's q = dfull's q; key head j = sum of dfull's heads of its group, in order.
template <typename T>
void gqa_reduce(Stream& s, T* dqkv /*(N, (H+2K)D)*/, const T* dfull /*(N, 3HD)*/, std::int64_t N, std::int64_t H,
                std::int64_t K, std::int64_t D);

}  // namespace stp
