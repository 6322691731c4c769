// Internal to the row-wise kernels (nn_kernels.cpp, llama_kernels.cpp, vocab_kernels.cpp): the
// launch grain, and the row walk LayerNorm and RMSNorm share. Each normalisation does one row n of
// a (N, C) tensor per task: it reduces the row in index order (its own statistics), then writes the
// row through store_row (forward) or store_dx_row (backward, onto an optional residual),
// elementwise from the value the caller computes for channel c. The helpers only walk; every value
// is the caller's expression, evaluated as before, so results do not depend on which kernel uses
// them. Column reductions (a bias or norm-weight gradient) and rows of independent elements name
// their launch shape instead (core/launch_shape.h: column_wise, row_wise).
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace stp::kernel_rows
