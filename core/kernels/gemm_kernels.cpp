// gemm_scale_output (core/kernels/gemm_kernels.h): one index per element of C.
#include "core/kernels/gemm_kernels.h"

#include <cstdint>

#include "core/launch.h"

namespace stp {

namespace {

template <typename T>
struct ScaleGemmOutput {
  T* c;  // (m, ldc), the first n columns of each row
  std::int64_t n, ldc;
  float beta;
  STP_HD void operator()(std::size_t i) const {
    const std::int64_t row = static_cast<std::int64_t>(i) / n, col = static_cast<std::int64_t>(i) % n;
    T& v = c[row * ldc + col];
    v = from_f32<T>(beta == 0.0f ? 0.0f : beta * to_f32(v));
  }
};

template <typename T>
void scale(Stream& s, const GemmArgs& g) {
  const std::size_t count = static_cast<std::size_t>(g.m) * static_cast<std::size_t>(g.n);
  launch(s, count, ScaleGemmOutput<T>{static_cast<T*>(g.c), g.n, g.ldc, g.beta});
}

}  // namespace

void gemm_scale_output(Stream& s, const GemmArgs& g) {
  STP_ASSERT(g.m >= 0 && g.n >= 0 && g.ldc >= g.n, "GEMM output shape (", g.m, ", ", g.n, ") with ldc ", g.ldc);
  if (g.c_type == DType::Bf16) scale<bf16>(s, g);
  else scale<float>(s, g);
}

}  // namespace stp
