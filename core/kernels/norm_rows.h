// Internal to the row-wise kernels (nn_kernels.cpp, llama_kernels.cpp, vocab_kernels.cpp): the
// launch grain, and the row walk LayerNorm and RMSNorm share. Each normalisation does one row n of
// a (N, C) tensor per task: it reduces the row in index order (its own statistics), then writes the
// row through store_row (forward) or store_dx_row (backward, onto an optional residual),
// elementwise from the value the caller computes for channel c. The helpers only walk; every value
// is the caller's expression, evaluated as before, so results do not depend on which kernel uses
// them.
//
// Column reductions (a bias or norm-weight gradient: one sum over the N rows per channel) run one
// task per block of column_block() adjacent channels: the task walks the rows once and keeps one
// accumulator per channel, so on the CPU a row's cache line is read once per block rather than
// once per channel. Each channel's sum still adds its rows in ascending order, so the results are
// bitwise those of one task per channel (what a CUDA stream launches: block width 1).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"

namespace stp::kernel_rows {

// Grain for row-wise kernels: enough rows for ~16K scalar ops per CPU task.
inline std::size_t row_grain(std::int64_t row_len) {
  return static_cast<std::size_t>(row_len >= 16384 ? 1 : 16384 / row_len);
}

// out row n (C elements, stored as T) = value(c), c in order.
template <typename T, typename F>
STP_HD inline void store_row(T* out, std::size_t n, std::int64_t C, F&& value) {
  T* o = out + n * C;
  for (std::int64_t c = 0; c < C; ++c) o[c] = from_f32<T>(value(c));
}

// dx row n = resid row n + value(c) (resid null: value(c)), c in order.
template <typename F>
STP_HD inline void store_dx_row(float* dx, const float* resid, std::size_t n, std::int64_t C, F&& value) {
  float* o = dx + n * C;
  const float* r = resid ? resid + n * C : nullptr;
  for (std::int64_t c = 0; c < C; ++c) {
    const float v = value(c);
    o[c] = r ? r[c] + v : v;
  }
}

// Widest column block (the size of a task's accumulator array).
constexpr std::int64_t kMaxColumnBlock = 16;

// Channels per column-reduction task: 16 (one 64-byte line of f32) on a CPU stream, 1 on a GPU
// stream (adjacent threads read adjacent channels).
inline std::int64_t column_block(Stream& s) { return s.device().kind() == DeviceKind::Cpu ? kMaxColumnBlock : 1; }

// Rows of `len` elements cut into `count` segments of `width` for a row kernel whose elements are
// computed on their own (the softmax gradient, SwiGLU, an embedding row's channels): task i is
// segment i % count of row i / count. row_segments() gives a CPU task the whole row, so it runs
// the row's vector form as one call, and a GPU thread one element, so a row of V = 151,936 logits
// is that many threads rather than one (adjacent threads, adjacent elements). No element's value
// depends on the split, so both give the results of one task per row.
struct RowSegments {
  std::int64_t len, width, count;
  struct Part {
    std::int64_t row, begin, size;  // elements [begin, begin + size) of row `row`
  };
  STP_HD Part part(std::size_t i) const {
    const auto t = static_cast<std::int64_t>(i);
    const std::int64_t begin = t % count * width;
    return {t / count, begin, len - begin < width ? len - begin : width};
  }
  std::size_t tasks(std::int64_t rows) const { return static_cast<std::size_t>(rows * count); }
};

inline RowSegments row_segments(Stream& s, std::int64_t len) {
  const std::int64_t width = s.device().kind() == DeviceKind::Cpu && len > 0 ? len : 1;
  return {len, width, (len + width - 1) / width};
}

// Number of tasks covering C channels in blocks of `block`.
inline std::size_t column_tasks(std::int64_t C, std::int64_t block) {
  return static_cast<std::size_t>((C + block - 1) / block);
}

}  // namespace stp::kernel_rows
