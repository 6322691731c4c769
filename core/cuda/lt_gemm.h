// LtGemm: every GEMM of one GPU through cublasLtMatmul (CUDA-only translation units).
//
// Contract (core/device.h, GemmArgs and Stream::gemm):
//   * one cuBLASLt handle per device, created with the device current; the stream is an argument of
//     each matmul, so any stream of the device can run a GEMM, ordered with its other work;
//   * a GEMM's algorithm is chosen once per shape with cublasLtMatmulAlgoGetHeuristic and cached
//     with its descriptors: the shape is a GemmShape (core/gemm_shape.h: trans_a, trans_b, m, n, k,
//     lda, ldb, ldc, the types, the alignment of the three pointers) and the workspace the calling
//     stream offers. prepare() chooses at setup (a trainer prepares every shape its steps run); the
//     first GEMM of a shape nobody prepared chooses itself, and run() says so (a late choice);
//   * f32 products and sums (CUBLAS_COMPUTE_32F, never TF32), f32 alpha and beta, and a bf16 output
//     rounded once from the f32 sum: split-K partial sums are kept in f32 (the reduction schemes
//     allowed, below), so the single-rounding rule of the CPU oracle holds;
//   * deterministic: for one shape, alignment and workspace the same algorithm runs every time, and
//     every reduction scheme allowed sums its partials in a fixed order (no atomics).
// Thread-safe: the cache is guarded; descriptors are only read after they are made.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/device.h"
#include "core/gemm_shape.h"

namespace stp {

class LtGemm {
 public:
  explicit LtGemm(int ordinal);  // the device `ordinal` is current
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues g on `stream` (its device current), with `workspace_bytes` of scratch at `workspace`
  // (0: algorithms that need none). True when it chose g's algorithm itself (nobody prepared it).
  bool run(cudaStream_t stream, const GemmArgs& g, void* workspace, std::size_t workspace_bytes);
  // Chooses and caches the algorithm of `shape` for a stream offering `workspace_bytes`
  // (Stream::prepare_gemm).
  void prepare(const GemmShape& shape, std::size_t workspace_bytes);
  std::size_t cached_shapes() const;

 private:
  struct Key {
    GemmShape shape;
    std::size_t workspace_bytes;
    bool operator<(const Key& o) const {
      return std::tie(shape, workspace_bytes) < std::tie(o.shape, o.workspace_bytes);
    }
  };
  struct Plan {
    cublasLtMatmulDesc_t desc{};
    cublasLtMatrixLayout_t a{}, b{}, c{};  // cuBLASLt's (column-major) A, B and C: stp's B, A and C
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace_bytes = 0;  // what the chosen algorithm uses
  };
  // The cached plan, chosen on first use; `chosen`, when given, says whether this call chose it.
  const Plan& plan(const Key& key, bool* chosen = nullptr);
  Plan choose(const Key& key) const;
  static void destroy(Plan& p);

  int ordinal_;
  cublasLtHandle_t handle_{};
  mutable std::mutex mu_;
  std::map<Key, Plan> plans_;  // node-based: a Plan never moves once made
};

}  // namespace stp
