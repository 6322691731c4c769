// Vocab-parallel kernels: the token embedding and the LM head's cross-entropy when each TP rank
// holds a contiguous block of Vs vocabulary rows, [v0, v0 + Vs), of which the first Vl are real
// (Vl < Vs only on the ranks holding the padding past the true vocabulary; docs/model.md,
// Vocab parallelism). The collectives between the steps are the caller's: every kernel here is
// local to one rank. Single source (core/launch.h): the CPU and CUDA backends run this code.
//
// Cross-entropy over sharded logits, per row n (N rows):
//   1. vocab_ce_max:      m_r = max over this rank's real columns (-inf when it has none);
//      caller: all_reduce_max -> m;
//   2. vocab_ce_partials: s_r = sum exp(l - m) over real columns, t_r = the target's logit if the
//      target is one of this rank's rows, else 0; stored [s (N) | t (N)];
//      caller: all_reduce_sum over both -> s, t;
//   3. vocab_ce_finish:   lse = m + log s, losses = lse - t (0 where the target is -1, an
//      ignored target), loss = the sum of losses / N (rows in order).
// Every rank then holds the same loss and lse; dlogits of its own columns are local (a row whose
// target is -1 gets 0: no rank holds the target, so every rank sees the same -1).
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"

namespace stp {

// out[n] = wte_shard[tokens[n] - v0] when v0 <= tokens[n] < v0 + Vs, else 0; plus wpe[n % T] when
// wpe is not null (the caller passes it on one rank only: the sum over ranks adds it once).
void vocab_embedding_forward(Stream& s, float* out /*(B*T,C)*/, const std::int32_t* tokens /*(B*T,)*/,
                             const float* wte_shard /*(Vs,C)*/, const float* wpe /*(>=T,C) or null*/, std::int64_t B,
                             std::int64_t T, std::int64_t C, std::int64_t v0, std::int64_t Vs);

// Int32 workspace elements vocab_embedding_backward_accumulate needs: Vs + 1 + B*T.
std::int64_t vocab_embedding_backward_workspace(std::int64_t Vs, std::int64_t BT);

// dwte_shard[v - v0] += the sum of the dout rows whose token is v, for this rank's rows only (rows
// summed in order, as embedding_backward_accumulate does); dwpe[t] += sum_b dout[b,t] when dwpe
// is not null.
void vocab_embedding_backward_accumulate(Stream& s, float* dwte_shard /*(Vs,C)*/, float* dwpe /*(>=T,C)*/,
                                         const float* dout /*(B*T,C)*/, const std::int32_t* tokens /*(B*T,)*/,
                                         std::int32_t* workspace, std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t v0, std::int64_t Vs);

template <typename T>
void vocab_ce_max(Stream& s, float* max /*(N,)*/, const T* logits /*(N,Vs)*/, std::int64_t N, std::int64_t Vs,
                  std::int64_t Vl);

template <typename T>
void vocab_ce_partials(Stream& s, float* partials /*(2N,): [sum exp | target logit]*/, const T* logits /*(N,Vs)*/,
                       const float* max /*(N,)*/, const std::int32_t* targets /*(N,)*/, std::int64_t N, std::int64_t Vs,
                       std::int64_t Vl, std::int64_t v0);

void vocab_ce_finish(Stream& s, float* loss /*(1,)*/, float* losses /*(N,)*/, float* lse /*(N,)*/,
                     const float* max /*(N,)*/, const float* partials /*(2N,)*/, const std::int32_t* targets /*(N,)*/,
                     std::int64_t N);

// vocab_ce_finish without the mean (the chunked loss head, models/unit_common.h): lse and losses of
// N rows, each by vocab_ce_finish's expression; the mean over every row is mean_of_rows
// (core/kernels/nn_kernels.h), which adds the losses in vocab_ce_finish's order.
void vocab_ce_rows(Stream& s, float* losses /*(N,)*/, float* lse /*(N,)*/, const float* max /*(N,)*/,
                   const float* partials /*(2N,)*/, const std::int32_t* targets /*(N,)*/, std::int64_t N);

// dlogits = (softmax - onehot(target)) * scale over this rank's columns, in place; the padding
// columns (>= Vl) get 0, and so does every column of a row whose target is -1.
template <typename T>
void vocab_ce_backward_inplace(Stream& s, T* logits /*(N,Vs) -> dlogits*/, const float* lse /*(N,)*/,
                               const std::int32_t* targets /*(N,)*/, float scale, std::int64_t N, std::int64_t Vs,
                               std::int64_t Vl, std::int64_t v0);

}  // namespace stp
