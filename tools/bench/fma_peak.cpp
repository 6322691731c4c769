#include "tools/bench/fma_peak.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/kernels/cpu_isa.h"

namespace stp::tools {
namespace {

// Twelve accumulators: more independent chains than FMA latency (4 cycles) times FMA ports (2),
// so the loop is throughput-bound. Returns a value the caller keeps, or the compiler would drop
// the loop.
constexpr int kChains = 12;

#if defined(__x86_64__)
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));

// The chains at the width of the GCC vector type V; `acc * x + y` contracts into one FMA
// instruction in the FMA-enabled callers below, into which this is always inlined.
template <typename V>
__attribute__((always_inline)) inline float fma_chains(long iters) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = V{} + static_cast<float>(i);
  const V x = V{} + 0.999999f, y = V{} + 1e-7f;
  for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * x + y;
  }
  float s = 0;
  for (int i = 0; i < kChains; ++i)
    for (int l = 0; l < lanes; ++l) s += acc[i][l];
  return s;
}

__attribute__((target("avx512f,fma"))) float fma_loop_avx512(long iters) { return fma_chains<v16>(iters); }
__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) { return fma_chains<v8>(iters); }
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
