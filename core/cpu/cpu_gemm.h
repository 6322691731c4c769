// The CPU backend's GEMM (Stream::gemm's contract in core/device.h), run on the calling thread.
#pragma once

#include "core/device.h"

namespace stp {

// f32 operands go to OpenBLAS's sgemm as they are. bf16 operands are widened to f32 (exact) into
// dense scratch, multiplied by the same sgemm (f32 products and sums, as CUBLAS_COMPUTE_32F),
// and a bf16 C is read widened (beta != 0) and written rounded to nearest even.
void cpu_gemm(const GemmArgs& g);

}  // namespace stp
