#include "tools/fma_peak.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/kernels/adamw_ranges.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stp::tools {
namespace {

// Twelve accumulators: more independent chains than FMA latency (4 cycles) times FMA ports (2),
// so the loop is throughput-bound. Returns a value the caller keeps, or the compiler would drop
// the loop.
constexpr int kChains = 12;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_loop_avx512(long iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  // Through memory rather than _mm512_reduce_add_ps, which GCC 12 flags as reading an
  // uninitialized value under -Werror.
  alignas(64) float lanes[16];
  float s = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float l : lanes) s += l;
  }
  return s;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  alignas(32) float lanes[8];
  float s = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float l : lanes) s += l;
  }
  return s;
}
#endif

// Seconds for `threads` threads to run `iters` iterations each, started together.
double timed_run(int lanes, int threads, long iters) {
  std::atomic<float> sink{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      ++ready;
      while (!go.load()) std::this_thread::yield();
#if defined(__x86_64__)
      sink = sink + (lanes == 16 ? fma_loop_avx512(iters) : fma_loop_avx2(iters));
#endif
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measured_fma_peak_gflops(int threads, double seconds) {
  const CpuIsa isa = best_cpu_isa();
  if (isa == CpuIsa::Scalar || threads < 1) return 0;
  const int lanes = isa == CpuIsa::Avx512 ? 16 : 8;
  // A short run sizes the measured one; the best of three measured runs is the rate.
  long iters = 1 << 16;
  const double probe = timed_run(lanes, threads, iters);
  iters = static_cast<long>(static_cast<double>(iters) * seconds / (probe > 0 ? probe : 1e-3));
  if (iters < 1 << 16) iters = 1 << 16;
  double best = 1e300;
  for (int r = 0; r < 3; ++r) {
    const double dt = timed_run(lanes, threads, iters);
    if (dt < best) best = dt;
  }
  const double flops = 2.0 * lanes * kChains * static_cast<double>(iters) * threads;
  return flops / best * 1e-9;
}

}  // namespace stp::tools
