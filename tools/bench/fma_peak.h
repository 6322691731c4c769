// The f32 multiply-add rate this CPU sustains: the ceiling any f32 GEMM on these cores works
// under, so a benchmark can say how far its GEMMs are from the hardware, not only from another
// library.
#pragma once

namespace stp::tools {

// GFLOP/s (an FMA counts 2) of `threads` threads, each running chains of independent vector FMAs
// on registers (16 lanes with AVX-512F, 8 with AVX2 + FMA) for about `seconds`; no loads or stores,
// so only the FMA units and the clock they run at limit it. 0 when the CPU has neither instruction
// set (the caller prints no ceiling then).
double measured_fma_peak_gflops(int threads, double seconds = 0.25);

}  // namespace stp::tools
