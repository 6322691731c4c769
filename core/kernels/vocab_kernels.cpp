// Vocab-parallel kernels (contract in vocab_kernels.h). Each functor does one row (or one
// vocabulary entry), one segment of it where its elements are independent, or its lane's share of
// a row through the row-reduction shape (core/launch_shape.h: RowReduce, in the canonical row order
// of core/reduce_order.h).
#include "core/kernels/vocab_kernels.h"

#include <cmath>

#include "core/kernels/norm_rows.h"
#include "core/kernels/softmax_rows.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

using i64 = std::int64_t;
using usize = std::size_t;

using kernel_rows::row_grain;

struct VocabEmbeddingForward {
  float* out;
  const std::int32_t* tokens;
  const float* wte;
  const float* wpe;
  i64 T, C, v0, Vs;
  STP_HD void operator()(usize n) const {
    const i64 row = static_cast<i64>(tokens[n]) - v0;
    const bool mine = row >= 0 && row < Vs;
    const float* e = wte + (mine ? row : 0) * C;
    const float* p = wpe ? wpe + static_cast<i64>(n % T) * C : nullptr;
    float* o = out + n * C;
    for (i64 c = 0; c < C; ++c) o[c] = (mine ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
  }
};

// The token buckets (core/launch_shape.h: StableBuckets): row n's bucket is its token's entry in
// this shard, or Vs for a token of another shard (those sort after every bucket and are never
// read). (The replicated table is the shard v0 = 0, Vs = V.)
struct VocabBucketKey {
  const std::int32_t* tokens;
  i64 v0, Vs;
  STP_HD i64 bucket(i64 n) const {
    const i64 r = static_cast<i64>(tokens[n]) - v0;
    return r >= 0 && r < Vs ? r : Vs;
  }
};

// One task per segment of a vocabulary entry's C channels (a row-wise launch: all C on a CPU
// stream, one channel per GPU thread). Each channel adds its rows in bucket order.
struct VocabEmbeddingBackwardWte {
  float* dwte;
  const float* dout;
  const std::int32_t* offsets;
  const std::int32_t* rows;
  RowSegments seg;
  STP_HD void operator()(usize i) const {
    const auto [v, c0, width] = seg.part(i);
    const i64 begin = offsets[v], end = offsets[v + 1], C = seg.len;
    if (begin == end) return;
    for (i64 c = c0; c < c0 + width; ++c) {
      float acc = 0.0f;
      for (i64 k = begin; k < end; ++k) acc += dout[static_cast<i64>(rows[k]) * C + c];
      dwte[v * C + c] += acc;
    }
  }
};

struct VocabWpeBackward {
  float* dwpe;
  const float* dout;
  i64 B, T, C;
  STP_HD void operator()(usize i) const {  // i = t * C + c
    float acc = 0.0f;
    for (i64 b = 0; b < B; ++b) acc += dout[b * T * C + static_cast<i64>(i)];
    dwpe[i] += acc;
  }
};

template <typename T>
struct VocabCeMax {
  float* max;
  const T* logits;
  i64 Vs, Vl;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float m = softmax_rows::row_max(rows, p, logits + p.row * Vs, Vl);
    if (rows.leader(p)) max[p.row] = m;
  }
};

template <typename T>
struct VocabCePartials {
  float* partials;
  const T* logits;
  const float* max;
  const std::int32_t* targets;
  i64 N, Vs, Vl, v0;
  RowReduce rows;
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const i64 n = p.row;
    const T* l = logits + n * Vs;
    const i64 t = static_cast<i64>(targets[n]) - v0;
    const float sum = softmax_rows::row_sum_exp(rows, p, l, Vl, max[n]);
    if (rows.leader(p)) {
      partials[n] = sum;
      partials[N + n] = t >= 0 && t < Vl ? to_f32(l[t]) : 0.0f;
    }
  }
};

// Row n's lse and loss from the row's max and its partial sums (sum-exp, target logit): the one
// expression both finishes below share.
STP_HD inline float vocab_ce_row(i64 n, i64 N, const float* max, const float* partials, const std::int32_t* targets,
                                 float* lse, float* losses) {
  const float z = max[n] + logf(partials[n]);
  lse[n] = z;
  losses[n] = targets[n] >= 0 ? z - partials[N + n] : 0.0f;  // an ignored target (-1) counts 0
  return losses[n];
}

// The rows' lse and losses, and their mean: one row of N, the mean in the canonical row order.
struct VocabCeFinish {
  float* loss;
  float* losses;
  float* lse;
  const float* max;
  const float* partials;
  const std::int32_t* targets;
  i64 N;
  RowReduce rows;  // one row
  STP_HD void operator()(usize task) const {
    const RowReduce::Part p = rows.part(task);
    const float acc = rows.sum(p, N, [&](i64 n) { return vocab_ce_row(n, N, max, partials, targets, lse, losses); });
    if (rows.leader(p)) loss[0] = acc / static_cast<float>(N);
  }
};

// The rows' lse and losses alone (the chunked head: the mean is taken once over every chunk's rows,
// mean_of_rows): vocab_ce_row, as VocabCeFinish, one task per row.
struct VocabCeRows {
  float* losses;
  float* lse;
  const float* max;
  const float* partials;
  const std::int32_t* targets;
  i64 N;
  STP_HD void operator()(usize i) const { vocab_ce_row(static_cast<i64>(i), N, max, partials, targets, lse, losses); }
};

// One task per segment of a row of Vs columns (a row-wise launch: the whole row on a CPU stream);
// every entry is computed on its own, so the split does not change a value.
template <typename T>
struct VocabCeBackward {
  T* logits;
  const float* lse;
  const std::int32_t* targets;
  float scale;
  i64 Vl, v0;
  RowSegments seg;  // over Vs
  STP_HD void operator()(usize i) const {
    const auto [n, c0, width] = seg.part(i);
    const i64 c1 = c0 + width;
    const i64 live_end = c1 < Vl ? c1 : Vl;  // [c0, live_end) are logits, [max(c0, Vl), c1) padding
    T* l = logits + n * seg.len;
    if (targets[n] < 0) {  // an ignored target: the row is not in the loss
      for (i64 v = c0; v < c1; ++v) l[v] = from_f32<T>(0.0f);
      return;
    }
    const float z = lse[n];
    const i64 target = static_cast<i64>(targets[n]) - v0;
    const bool here = target >= c0 && target < live_end;
    const float at_target = here ? exp_nonpositive(to_f32(l[target]) - z) * scale : 0.0f;
    if (live_end > c0) softmax_rows::row_exp_scaled(l + c0, live_end - c0, z, scale);
    for (i64 v = c0 > Vl ? c0 : Vl; v < c1; ++v) l[v] = from_f32<T>(0.0f);
    if (here) l[target] = from_f32<T>(at_target - scale);
  }
};

}  // namespace

void vocab_embedding_forward(Stream& s, float* out, const std::int32_t* tokens, const float* wte_shard,
                             const float* wpe, i64 B, i64 T, i64 C, i64 v0, i64 Vs) {
  launch(s, static_cast<usize>(B * T), VocabEmbeddingForward{out, tokens, wte_shard, wpe, T, C, v0, Vs}, row_grain(C));
}

i64 vocab_embedding_backward_workspace(i64 Vs, i64 BT) { return Vs + 1 + BT; }

void vocab_embedding_backward_accumulate(Stream& s, float* dwte_shard, float* dwpe, const float* dout,
                                         const std::int32_t* tokens, std::int32_t* workspace, i64 B, i64 T, i64 C,
                                         i64 v0, i64 Vs) {
  std::int32_t* offsets = workspace;
  std::int32_t* rows = workspace + Vs + 1;
  bucket_rows(s, stable_buckets(s, B * T, Vs), VocabBucketKey{tokens, v0, Vs}, offsets, rows);
  // Most vocabulary entries are absent from a batch and cost one comparison each.
  const RowSegments seg = row_wise(s, Vs, C);
  launch(s, seg, VocabEmbeddingBackwardWte{dwte_shard, dout, offsets, rows, seg}, 256);
  if (dwpe != nullptr) launch(s, static_cast<usize>(T * C), VocabWpeBackward{dwpe, dout, B, T, C}, row_grain(B));
}

template <typename T>
void vocab_ce_max(Stream& s, float* max, const T* logits, i64 N, i64 Vs, i64 Vl) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, VocabCeMax<T>{max, logits, Vs, Vl, rows}, row_grain(Vs));
}

template <typename T>
void vocab_ce_partials(Stream& s, float* partials, const T* logits, const float* max, const std::int32_t* targets,
                       i64 N, i64 Vs, i64 Vl, i64 v0) {
  const RowReduce rows = row_reduce(s, N);
  launch(s, rows, VocabCePartials<T>{partials, logits, max, targets, N, Vs, Vl, v0, rows}, row_grain(Vs));
}

void vocab_ce_finish(Stream& s, float* loss, float* losses, float* lse, const float* max, const float* partials,
                     const std::int32_t* targets, i64 N) {
  const RowReduce one = row_reduce(s, 1);
  launch(s, one, VocabCeFinish{loss, losses, lse, max, partials, targets, N, one}, 1);
}

void vocab_ce_rows(Stream& s, float* losses, float* lse, const float* max, const float* partials,
                   const std::int32_t* targets, i64 N) {
  launch(s, static_cast<usize>(N), VocabCeRows{losses, lse, max, partials, targets, N}, 1024);
}

template <typename T>
void vocab_ce_backward_inplace(Stream& s, T* logits, const float* lse, const std::int32_t* targets, float scale, i64 N,
                               i64 Vs, i64 Vl, i64 v0) {
  const RowSegments seg = row_wise(s, N, Vs);
  launch(s, seg, VocabCeBackward<T>{logits, lse, targets, scale, Vl, v0, seg}, row_grain(Vs));
}

#define STP_PER_ACTIVATION_TYPE(T)                                                                                \
  template void vocab_ce_max<T>(Stream&, float*, const T*, i64, i64, i64);                                        \
  template void vocab_ce_partials<T>(Stream&, float*, const T*, const float*, const std::int32_t*, i64, i64, i64, \
                                     i64);                                                                        \
  template void vocab_ce_backward_inplace<T>(Stream&, T*, const float*, const std::int32_t*, float, i64, i64, i64, i64);
STP_PER_ACTIVATION_TYPE(float)
STP_PER_ACTIVATION_TYPE(bf16)
#undef STP_PER_ACTIVATION_TYPE

}  // namespace stp
