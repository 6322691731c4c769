// The vector forms of adamw_element (contract in adamw_ranges.h): separate multiply / add / divide /
// sqrt instructions, each rounding as the scalar f32 operation.
#include "core/kernels/adamw_ranges.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STP_X86 1
#endif

namespace stp {
namespace {

// Scaled: the gradient is read as g * gscale (adamw_element_scaled); otherwise gscale is unused.
template <bool Scaled>
void scalar_range(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                  const AdamWScalars& c, float gscale) {
  for (std::size_t i = begin; i < end; ++i) {
    if constexpr (Scaled) adamw_element_scaled(p, g, m, v, i, c, gscale);
    else adamw_element(p, g, m, v, i, c);
  }
}

#if STP_X86
template <bool Scaled>
__attribute__((target("avx2"))) void avx2_range(float* p, const float* g, float* m, float* v, std::size_t begin,
                                                std::size_t end, const AdamWScalars& c, float gscale) {
  const __m256 gs = _mm256_set1_ps(gscale);
  const __m256 df = _mm256_set1_ps(c.decay_factor), b1 = _mm256_set1_ps(c.beta1), b2 = _mm256_set1_ps(c.beta2),
               omb1 = _mm256_set1_ps(c.one_minus_beta1), omb2 = _mm256_set1_ps(c.one_minus_beta2),
               ss = _mm256_set1_ps(c.step_size), b2s = _mm256_set1_ps(c.bias2_sqrt), eps = _mm256_set1_ps(c.eps);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 gi = _mm256_loadu_ps(g + i);
    if constexpr (Scaled) gi = _mm256_mul_ps(gi, gs);
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), df);
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(gi, omb1));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2), _mm256_mul_ps(_mm256_mul_ps(gi, gi), omb2));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), b2s), eps);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(ss, _mm256_div_ps(mi, denom))));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  scalar_range<Scaled>(p, g, m, v, i, end, c, gscale);
}

template <bool Scaled>
__attribute__((target("avx512f"))) void avx512_range(float* p, const float* g, float* m, float* v, std::size_t begin,
                                                     std::size_t end, const AdamWScalars& c, float gscale) {
  const __m512 gs = _mm512_set1_ps(gscale);
  const __m512 df = _mm512_set1_ps(c.decay_factor), b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2),
               omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2),
               ss = _mm512_set1_ps(c.step_size), b2s = _mm512_set1_ps(c.bias2_sqrt), eps = _mm512_set1_ps(c.eps);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 gi = _mm512_loadu_ps(g + i);
    if constexpr (Scaled) gi = _mm512_mul_ps(gi, gs);
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
  scalar_range<Scaled>(p, g, m, v, i, end, c, gscale);
}
#endif

template <bool Scaled>
void any_range(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
               const AdamWScalars& c, float gscale) {
  switch (isa) {
#if STP_X86
    case CpuIsa::Avx512: avx512_range<Scaled>(p, g, m, v, begin, end, c, gscale); return;
    case CpuIsa::Avx2: avx2_range<Scaled>(p, g, m, v, begin, end, c, gscale); return;
#endif
    default: scalar_range<Scaled>(p, g, m, v, begin, end, c, gscale);
  }
}

}  // namespace

void adamw_range(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                 const AdamWScalars& c) {
  any_range<false>(isa, p, g, m, v, begin, end, c, 1.0f);
}

void adamw_range_scaled(CpuIsa isa, float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end,
                        const AdamWScalars& c, float gscale) {
  any_range<true>(isa, p, g, m, v, begin, end, c, gscale);
}

}  // namespace stp
