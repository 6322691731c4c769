// The canonical summation orders of the reduction launch shapes (core/launch_shape.h: RowReduce,
// ColumnSlices), written out once as plain scalar code. Every backend adds the same terms in the
// same order, so a sum is bitwise the same on a CPU stream, on a GPU and in a test's reference,
// whatever the thread count or the split:
//
//   Row of n terms (RowReduce): kPartials = 32 partial sums; partial j starts at 0.0f and adds the
//       terms j, j + 32, j + 64, ... in increasing index (term c goes to partial c % 32, also in a
//       row's last, partial block of 32); then tree32 adds the partials.
//   Column of `height` rows (ColumnSlices): the rows are cut into kPartials = 32 contiguous slices,
//       slice s holding rows [slice_begin(s, height), slice_begin(s + 1, height)) (some empty when
//       height < 32); each slice's partial starts at 0.0f and adds its rows in increasing order;
//       then tree32 adds the 32 slice partials.
//   tree32 (both): for step = 16, 8, 4, 2, 1, in that order: p[j] = p[j] + p[j + step] for every
//       j < step; the result is p[0]. This is the order of a warp's shuffle-down tree, and of
//       adding a row's partials as two 16-lane, or four 8-lane, vectors: halves added, then halves
//       of the result, ...
//   A maximum (RowReduce::max) uses the same partials and tree with `a > b ? a : b` in place of
//   the addition; it skips NaN terms and is exact in any order.
//
// A term's own value is the caller's expression; where a backend fuses a multiply and an add
// inside it (an FMA on a GPU, or a CPU vector form) the terms, and so the sum, may differ in the
// last bits. The order never does.
#pragma once

#include <cstdint>

#include "core/dtype.h"  // STP_HD

namespace stp::reduce_order {

constexpr int kPartials = 32;

// p[0] after the pairwise steps 16, 8, 4, 2, 1 over p[0, 32) (p is overwritten).
STP_HD inline float tree32(float* p) {
  for (int step = kPartials / 2; step >= 1; step /= 2)
    for (int j = 0; j < step; ++j) p[j] = p[j] + p[j + step];
  return p[0];
}

// tree32 with the maximum in place of the addition.
STP_HD inline float tree32_max(float* p) {
  for (int step = kPartials / 2; step >= 1; step /= 2)
    for (int j = 0; j < step; ++j) p[j] = p[j + step] > p[j] ? p[j + step] : p[j];
  return p[0];
}

// First row of slice s (0 <= s <= kPartials) of a column of `height` rows: s * height / 32.
STP_HD inline std::int64_t slice_begin(int s, std::int64_t height) { return s * height / kPartials; }

}  // namespace stp::reduce_order
