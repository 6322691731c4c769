// LtGemm (core/cuda/lt_gemm.h). Row-major GemmArgs become cuBLASLt's column-major problem as in
// cublasGemmEx before: row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ, so cuBLASLt's
// A is stp's B, its B is stp's A, and m and n swap; leading dimensions stay.
#include "core/cuda/lt_gemm.h"

#include <algorithm>

#include "base/error.h"
#include "core/cuda/cuda_check.h"

namespace stp {

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::Bf16 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  STP_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}
template <typename T>
void set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  STP_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
}

}  // namespace

LtGemm::LtGemm(int ordinal) : ordinal_(ordinal) { STP_CUDA_CHECK(cublasLtCreate(&handle_)); }

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) destroy(p);
  (void)cublasLtDestroy(handle_);
}

void LtGemm::destroy(Plan& p) {
  if (p.a) (void)cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) (void)cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) (void)cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) (void)cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

LtGemm::Plan LtGemm::choose(const Key& k) const {
  // f32 x f32 -> f32, bf16 x bf16 -> f32 or bf16; always f32 products and sums (core/device.h).
  const GemmShape& key = k.shape;
  STP_ASSERT(key.ab == DType::Bf16 || key.c_type == DType::F32, "GEMM with f32 inputs writes f32");
  Plan p;
  try {
    // CUBLAS_COMPUTE_32F (not ..._FAST_TF32 or ..._FAST_16BF): f32 products and sums, as the CPU
    // backend's sgemm; scale type f32, so alpha and beta are f32 for bf16 outputs too.
    STP_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is stp's B
    cublasOperation_t tb = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
    // Stored (not transposed) shapes, column-major: A' = op⁻¹ of an (n, k) matrix, B' of a (k, m).
    const cudaDataType_t ab = cuda_type(key.ab);
    STP_CUDA_CHECK(
        cublasLtMatrixLayoutCreate(&p.a, ab, key.trans_b ? key.k : key.n, key.trans_b ? key.n : key.k, key.ldb));
    STP_CUDA_CHECK(
        cublasLtMatrixLayoutCreate(&p.b, ab, key.trans_a ? key.m : key.k, key.trans_a ? key.k : key.m, key.lda));
    STP_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(key.c_type), key.n, key.m, key.ldc));

    cublasLtMatmulPreference_t pref{};
    STP_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = [&] {
      set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(k.workspace_bytes));
      // Split-K reductions that keep the single rounding and a fixed order. NONE: one sequential
      // dot product per output. INPLACE, for f32 outputs only: the parts are added into the f32
      // output one after another, in an order counters in the workspace fix. For a bf16 output
      // INPLACE and OUTPUT_TYPE would round every partial sum to bf16, against stp's rule that a
      // bf16 output is rounded once, from the f32 sum (docs/gpu-readiness.md, cuBLAS); COMPUTE_TYPE
      // (f32 parts reduced by a separate kernel) stays out until a GPU run shows it bitwise run
      // to run.
      const std::uint32_t schemes = key.c_type == DType::F32
                                        ? CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_INPLACE
                                        : CUBLASLT_REDUCTION_SCHEME_NONE;
      set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
      set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
      set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
      set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
      set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
      return cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    }();
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0))
      throw InternalError(str("cuBLASLt has no algorithm for the GEMM m ", key.m, " n ", key.n, " k ", key.k, " lda ",
                              key.lda, " ldb ", key.ldb, " ldc ", key.ldc, " trans ", key.trans_a, key.trans_b, " (",
                              to_string(key.ab), " -> ", to_string(key.c_type), ") on GPU ", ordinal_,
                              " with alignments ", key.align_a, "/", key.align_b, "/", key.align_c, " bytes and ",
                              k.workspace_bytes, " bytes of workspace"));
    STP_CUDA_CHECK(status);
    p.algo = result.algo;
    p.workspace_bytes = result.workspaceSize;
  } catch (...) {
    destroy(p);
    throw;
  }
  return p;
}

const LtGemm::Plan& LtGemm::plan(const Key& key, bool* chosen) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (chosen) *chosen = it == plans_.end();
  if (it != plans_.end()) return it->second;
  return plans_.emplace(key, choose(key)).first->second;
}

void LtGemm::prepare(const GemmShape& shape, std::size_t workspace_bytes) {
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0) return;
  (void)plan(Key{shape, workspace_bytes});
}

std::size_t LtGemm::cached_shapes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

bool LtGemm::run(cudaStream_t stream, const GemmArgs& g, void* workspace, std::size_t workspace_bytes) {
  if (g.m == 0 || g.n == 0) return false;
  STP_ASSERT(g.k > 0, "a GEMM with k == 0 is gemm_scale_output's (core/kernels/gemm_kernels.h)");
  bool chosen = false;
  const Plan& p = plan(Key{gemm_shape_of(g), workspace_bytes}, &chosen);
  STP_ASSERT(p.workspace_bytes <= workspace_bytes, "cuBLASLt algorithm needs ", p.workspace_bytes,
             " bytes of workspace, the stream has ", workspace_bytes);
  STP_CUDA_CHECK(cublasLtMatmul(handle_, p.desc, &g.alpha, g.b, p.a, g.a, p.b, &g.beta, g.c, p.c, g.c, p.c, &p.algo,
                                workspace, workspace_bytes, stream));
  return chosen;
}

}  // namespace stp
