// The part of a GEMM that is not a product: with k == 0, C = alpha·op(A)·op(B) + beta·C is
// C = beta·C, which cuBLASLt's matrix layouts cannot describe (a zero-length inner dimension).
// Both backends' Stream::gemm route k == 0 here, so the CPU tests prove the code the GPU runs.
#pragma once

#include "core/device.h"

namespace stp {

// C = beta·C over the (m, n) row-major C of `g` (leading dimension ldc, type c_type); beta == 0
// writes zeros without reading C, as BLAS does, so an uninitialised C holding NaN reads as zero.
// One launch on `g`'s stream order; m·n == 0 launches nothing.
void gemm_scale_output(Stream& s, const GemmArgs& g);

}  // namespace stp
