// Memory-efficient fused causal attention, written once for both backends (core/launch.h): a
// tiled forward with an online softmax that keeps only the output and one log-sum-exp per query
// row, and a backward that recomputes the probabilities tile by tile from q, k, v, the output and
// the log-sum-exp. Activation memory is linear in the sequence length; nothing (T, T) is ever
// stored. The naive kernels (attention_forward / attention_backward in nn_kernels.h) stay the
// reference.
//
// Layout (AttentionLayout): element (b, t, head, d) of q lives at q[(b*T + t)*ldq + head*D + d];
// k and v use ldkv and n_kv_head heads, the output o and its gradient use ldo. Gradients have the
// layout of their values (dq like q, dk/dv like k/v, do like o), so GPT-2's packed qkv rows
// [q | k | v] are q = qkv, k = qkv + NH*D, v = qkv + 2*NH*D with ldq = ldkv = 3*NH*D.
// Grouped-query attention: query head h reads k/v head h / (NH / NKV); NKV divides NH (NKV = NH is
// multi-head attention). lse and the backward's workspace are (B, NH, T) f32, row (b, h, t) at
// (b*NH + h)*T + t.
//
// Math: s_ij = (q_i . k_j) / sqrt(D) for j <= i; lse_i = log sum_{j<=i} exp(s_ij);
// o_i = sum_j exp(s_ij - lse_i) v_j. Backward (the usual FlashAttention identities), with
// p_ij = exp(s_ij - lse_i) and delta_i = do_i . o_i:
//   dv_j = sum_i p_ij do_i      dp_ij = do_i . v_j      ds_ij = p_ij (dp_ij - delta_i)
//   dq_i = sum_j ds_ij k_j / sqrt(D)                    dk_j = sum_i ds_ij q_i / sqrt(D)
// (dk and dv of a k/v head sum over the query heads of its group.)
//
// Work split: the forward is one task per (batch, query head, block of query rows) that walks the
// key tiles up to the diagonal. The backward's dk/dv of a key tile walk the group's query heads,
// then the query tiles from the diagonal on, in that fixed order. On the CPU one task per (batch,
// k/v head) does its key tiles in order and accumulates dq on the way (f32, in the workspace); on
// CUDA dk/dv are one block of threads per (batch, k/v head, key tile), one key per thread, and dq a
// second kernel, one block per (batch, head, query tile), one query row per thread, walking the key
// tiles in order. Every output element is written by exactly one task (thread) and every sum runs in
// a fixed order inside it (no atomics, no sums across tasks), so results are bitwise independent of
// the thread count and of the runs.
// CPU stream (GCC x86-64 host builds, CPUs with AVX2 + FMA): blocks of 128 query rows per forward
// task (key tiles of 32) and of 128 keys per backward step (query tiles of 32), widened to f32 once
// per block and reused by every row of the other operand; the tile products are register-blocked
// on 8-wide vectors and the exponentials vectorised; tasks spread by oneTBB (attention_kernels_avx2.cpp).
// A CPU stream elsewhere (nvcc builds, other compilers or CPUs) runs the plain functors with tiles
// of kCpuAttentionTile rows. CUDA stream: blocks of kRowBlockThreads threads (RowBlock,
// core/launch_shape.h), one query row (or key) per thread, the k/v tiles (q/do tiles for dk/dv) of
// kCpuAttentionTile rows staged in block-shared memory; each thread walks exactly the tiles the plain
// functors walk for its row and adds in their order, so o, lse, dq, dk and dv are bitwise the plain
// functors' (but for nvcc's fused multiply-adds; tests run the layout emulated on a CPU stream).
// No tensor cores: bf16 shapes that cuDNN runs go there. The models call these kernels only where the
// stream offers no attention library for the shape (Stream::library_attention_forward, core/device.h:
// cuDNN's flash attention in bf16 on CUDA; models/attention_steps.h).
// Precision: T is float or bf16 (core/dtype.h). Loads widen exactly, every score, exponential,
// running max/sum and accumulator is f32, and each output is rounded once on store; lse is f32.
// Limits: D <= kMaxAttentionHeadDim (stp::Error otherwise).
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"

namespace stp {

inline constexpr std::int64_t kMaxAttentionHeadDim = 128;
inline constexpr std::int64_t kCpuAttentionTile = 32;  // query and key rows per tile of the plain CPU functors

struct AttentionLayout {
  std::int64_t B = 0, T = 0, NH = 0, NKV = 0, D = 0;
  std::int64_t ldq = 0, ldkv = 0, ldo = 0;  // row strides in elements
};

// o = causal attention of q, k, v; lse (B, NH, T) = the log-sum-exp of each query row's scores.
template <typename T>
void fused_attention_forward(Stream& s, const AttentionLayout& L, T* o, float* lse, const T* q, const T* k, const T* v);

// f32 elements of the backward's workspace: B * NH * T * (1 + D) (do . o per query row, and on the
// CPU the f32 dq accumulators of the one-pass backward).
std::int64_t fused_attention_backward_workspace(const AttentionLayout& L);

// dq, dk, dv (overwritten) from do, the forward's inputs, its output o and lse.
// workspace: fused_attention_backward_workspace(L) f32 elements of device memory.
template <typename T>
void fused_attention_backward(Stream& s, const AttentionLayout& L, T* dq, T* dk, T* dv, float* workspace, const T* dout,
                              const T* q, const T* k, const T* v, const T* o, const float* lse);

}  // namespace stp
