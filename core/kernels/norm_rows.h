// Internal to the row-wise kernels (nn_kernels.cpp, llama_kernels.cpp, vocab_kernels.cpp): the
// launch grain, and the row walk LayerNorm and RMSNorm share. Each normalisation does one row n of
// a (N, C) tensor per row-reduction task (core/launch_shape.h: RowReduce; one warp per row on a
// GPU): it reduces the row in the canonical row order (its own statistics, RowReduce::sum), then
// writes the row through store_row (forward) or store_dx_row (backward, onto an optional
// residual), elementwise from the value the caller computes for channel c. The helpers only walk;
// every value is the caller's expression. Column reductions (a bias or norm-weight gradient) and
// rows of independent elements name their launch shape instead (column_sums, row_wise).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/launch_shape.h"

namespace stp::kernel_rows {

// Grain for row-wise kernels: enough rows for ~16K scalar ops per CPU task.
inline std::size_t row_grain(std::int64_t row_len) {
  return static_cast<std::size_t>(row_len >= 16384 ? 1 : 16384 / row_len);
}

// out row p.row (C elements, stored as T) = value(c), the row's lanes taking c in turn.
template <typename T, typename F>
STP_HD inline void store_row(const RowReduce& rows, RowReduce::Part p, T* out, std::int64_t C, F&& value) {
  T* o = out + p.row * C;
  rows.each(p, C, [&](std::int64_t c) { o[c] = from_f32<T>(value(c)); });
}

// dx row p.row = resid row + value(c) (resid null: value(c)), the row's lanes taking c in turn.
template <typename F>
STP_HD inline void store_dx_row(const RowReduce& rows, RowReduce::Part p, float* dx, const float* resid, std::int64_t C,
                                F&& value) {
  float* o = dx + p.row * C;
  const float* r = resid ? resid + p.row * C : nullptr;
  rows.each(p, C, [&](std::int64_t c) {
    const float v = value(c);
    o[c] = r ? r[c] + v : v;
  });
}

}  // namespace stp::kernel_rows
