#include "optim/cpu_adamw.h"

#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "memory/numa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STP_X86 1
#endif

namespace stp {
namespace {

// The element formula of adamw_step, operation for operation.
inline void scalar_range(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                         const AdamWScalars& c) {
  for (std::size_t i = begin; i < end; ++i) {
    float gi = g[i];
    float pi = p[i] * c.decay_factor;
    float mi = m[i] * c.beta1 + gi * c.one_minus_beta1;
    float vi = v[i] * c.beta2 + (gi * gi) * c.one_minus_beta2;
    float denom = std::sqrt(vi) / c.bias2_sqrt + c.eps;
    p[i] = pi - c.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

#if STP_X86
// Separate multiply / add / divide / sqrt instructions: each rounds as the scalar f32 operation.
__attribute__((target("avx2"))) void avx2_range(float* p, const float* g, float* m, float* v, std::size_t begin,
                                                std::size_t end, const AdamWScalars& c) {
  const __m256 df = _mm256_set1_ps(c.decay_factor), b1 = _mm256_set1_ps(c.beta1), b2 = _mm256_set1_ps(c.beta2),
               omb1 = _mm256_set1_ps(c.one_minus_beta1), omb2 = _mm256_set1_ps(c.one_minus_beta2),
               ss = _mm256_set1_ps(c.step_size), b2s = _mm256_set1_ps(c.bias2_sqrt), eps = _mm256_set1_ps(c.eps);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 gi = _mm256_loadu_ps(g + i);
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), df);
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(gi, omb1));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2), _mm256_mul_ps(_mm256_mul_ps(gi, gi), omb2));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), b2s), eps);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(ss, _mm256_div_ps(mi, denom))));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  scalar_range(p, g, m, v, i, end, c);
}

__attribute__((target("avx512f"))) void avx512_range(float* p, const float* g, float* m, float* v, std::size_t begin,
                                                     std::size_t end, const AdamWScalars& c) {
  const __m512 df = _mm512_set1_ps(c.decay_factor), b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2),
               omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2),
               ss = _mm512_set1_ps(c.step_size), b2s = _mm512_set1_ps(c.bias2_sqrt), eps = _mm512_set1_ps(c.eps);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 gi = _mm512_loadu_ps(g + i);
    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), df);
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1), _mm512_mul_ps(gi, omb1));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(gi, gi), omb2));
    // The zero-masked form computes every lane (mask all ones), the same IEEE square root;
    // the plain _mm512_sqrt_ps trips GCC 12's -Wmaybe-uninitialized on its undefined pass-through.
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_maskz_sqrt_ps(0xFFFF, vi), b2s), eps);
    _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(ss, _mm512_div_ps(mi, denom))));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
  }
  scalar_range(p, g, m, v, i, end, c);
}
#endif

void run_range(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
               const AdamWScalars& c) {
  switch (isa) {
#if STP_X86
    case CpuIsa::Avx512: avx512_range(p, g, m, v, begin, end, c); return;
    case CpuIsa::Avx2: avx2_range(p, g, m, v, begin, end, c); return;
#endif
    default: scalar_range(p, g, m, v, begin, end, c);
  }
}

}  // namespace

std::string to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Scalar: break;
  }
  return "scalar";
}

bool cpu_has_isa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return true;
#if STP_X86
    case CpuIsa::Avx2: return __builtin_cpu_supports("avx2");
    case CpuIsa::Avx512: return __builtin_cpu_supports("avx512f");
#endif
    default: return false;
  }
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = cpu_has_isa(CpuIsa::Avx512) ? CpuIsa::Avx512
                             : cpu_has_isa(CpuIsa::Avx2) ? CpuIsa::Avx2
                                                         : CpuIsa::Scalar;
  return best;
}

void cpu_adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWScalars& c, CpuIsa isa,
                      bool parallel) {
  STP_CHECK(cpu_has_isa(isa), "cpu_adamw_update: this CPU does not run ", to_string(isa));
  if (n == 0) return;
  if (!parallel) return run_range(isa, p, g, m, v, 0, n, c);
  for_cpu_blocks(n, [&](std::size_t begin, std::size_t end) { run_range(isa, p, g, m, v, begin, end, c); });
}

void for_cpu_blocks(std::size_t n, const std::function<void(std::size_t begin, std::size_t end)>& fn) {
  if (n <= kCpuAdamWGrain) return fn(0, n);
#if defined(STP_TSAN)
  // Debian's libtbb is not instrumented: ThreadSanitizer cannot see the synchronization inside it
  // and reports every hand-off of a block to a worker as a race. Under it the same blocks run in
  // order on the calling thread, so what it checks is ours: several ranks' updates at once.
  for (std::size_t begin = 0; begin < n; begin += kCpuAdamWGrain) fn(begin, std::min(n, begin + kCpuAdamWGrain));
#else
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n, kCpuAdamWGrain),
      [&](const tbb::blocked_range<std::size_t>& r) { fn(r.begin(), r.end()); }, tbb::simple_partitioner());
#endif
}

CpuAdamWState::CpuAdamWState(const std::vector<std::size_t>& sizes, int node) : sizes_(sizes) {
  // Each moment starts on a 64-byte boundary (one cache line, one AVX-512 vector).
  auto padded = [](std::size_t n) { return (n + 15) / 16 * 16; };
  std::size_t floats = 0;
  for (std::size_t n : sizes_) floats += 2 * padded(n);
  bytes_ = std::max<std::size_t>(floats * sizeof(float), 1);
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STP_CHECK(base_ != MAP_FAILED, "CpuAdamWState: cannot map ", bytes_, " bytes of host memory: ", std::strerror(errno));
  // Bound before the first touch, so the zero pages are allocated on the node.
  bound_ = node >= 0 && bind_memory(base_, bytes_, node);
  auto* at = static_cast<float*>(base_);
  for (std::size_t n : sizes_) {
    m_.push_back(at);
    at += padded(n);
    v_.push_back(at);
    at += padded(n);
  }
  // Touch every page now (in parallel, as the updates will), not in the first step.
  // for_cpu_blocks, not a bare parallel_for: under ThreadSanitizer the blocks must run on this
  // thread, or the readers of the zeroed state race with oneTBB workers TSan cannot see join.
  auto* all = static_cast<float*>(base_);
  for_cpu_blocks(floats, [all](std::size_t begin, std::size_t end) {
    std::memset(all + begin, 0, (end - begin) * sizeof(float));
  });
}

CpuAdamWState::~CpuAdamWState() {
  if (base_ && base_ != MAP_FAILED) munmap(base_, bytes_);
}

}  // namespace stp
