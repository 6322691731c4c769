#include "core/cpu/cpu_gemm.h"

#include <cblas.h>

#include <vector>

#include "base/error.h"

namespace stp {
namespace {

// rows x cols of a row-major bf16 matrix with leading dimension ld, widened into dense f32.
void widen(std::vector<float>& out, const bf16* in, int rows, int cols, int ld) {
  out.resize(static_cast<std::size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(r) * cols + c] = to_f32(in[static_cast<std::size_t>(r) * ld + c]);
}

}  // namespace

void cpu_gemm(const GemmArgs& g) {
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans, tb = g.trans_b ? CblasTrans : CblasNoTrans;
  if (g.ab == DType::F32) {
    STP_ASSERT(g.c_type == DType::F32, "GEMM with f32 inputs writes f32");
    cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a), g.lda,
                static_cast<const float*>(g.b), g.ldb, g.beta, static_cast<float*>(g.c), g.ldc);
    return;
  }
  // Scratch per stream thread, reused across calls (a stream runs one GEMM at a time).
  thread_local std::vector<float> a, b, c;
  widen(a, static_cast<const bf16*>(g.a), g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda);
  widen(b, static_cast<const bf16*>(g.b), g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb);
  const int lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
  if (g.c_type == DType::F32) {
    cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta,
                static_cast<float*>(g.c), g.ldc);
    return;
  }
  bf16* out = static_cast<bf16*>(g.c);
  if (g.beta != 0.0f) widen(c, out, g.m, g.n, g.ldc);
  else c.assign(static_cast<std::size_t>(g.m) * g.n, 0.0f);
  cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, c.data(), g.n);
  for (int r = 0; r < g.m; ++r)
    for (int j = 0; j < g.n; ++j)
      out[static_cast<std::size_t>(r) * g.ldc + j] = from_f32<bf16>(c[static_cast<std::size_t>(r) * g.n + j]);
}

}  // namespace stp
