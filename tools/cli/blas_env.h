// OpenBLAS's thread pool, tuned before the library starts. After each multithreaded GEMM
// OpenBLAS's idle workers spin, calling sched_yield, for 2^28 cycles (about 0.1 s) before they
// sleep. stp interleaves its GEMMs with oneTBB-parallel elementwise kernels on the same cores, so
// a spinning worker takes CPU time from those (7% of the samples of a CPU training step, and the
// kernels between the GEMMs run slower). OPENBLAS_THREAD_TIMEOUT sets the spin to 2^n cycles
// (4 <= n <= 30), but OpenBLAS reads it only when it is loaded, before main() runs. So `stp` and
// bench_model re-execute themselves once, first thing in main(), with the variable set to
// kBlasThreadTimeout (2^14 cycles, ~5 us at 3 GHz) unless the user set it (or its older name
// GOTO_THREAD_TIMEOUT); docs/measurements/bench_model.md has the measurements. Processes they start
// (the torch script of bench_model) inherit it.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace stp::tools {

constexpr int kBlasThreadTimeout = 14;

// The value to set OPENBLAS_THREAD_TIMEOUT to, given the environment (`get` returns a variable's
// value or nullptr): kBlasThreadTimeout, or nothing when the user already chose one.
std::optional<std::string> blas_thread_timeout_to_set(const std::function<const char*(const char*)>& get);

// Sets OPENBLAS_THREAD_TIMEOUT and re-executes this program (/proc/self/exe, the same argv) when
// blas_thread_timeout_to_set says so; returns when nothing needs doing or when the exec fails (the
// program then runs on with OpenBLAS's default). Call before anything else in main().
void reexec_with_blas_tuning(char** argv);

}  // namespace stp::tools
