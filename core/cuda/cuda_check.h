// Error checks for CUDA, cuBLAS and NCCL calls (CUDA-only translation units).
// One generic macro: a failure throws stp::Error naming the call, its status and message,
// after clearing CUDA's sticky "last error" so later calls report their own failures.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"

namespace stp::cuda {

inline const char* status_string(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* status_string(ncclResult_t e) { return ncclGetErrorString(e); }
inline const char* status_string(cublasStatus_t e) { return cublasGetStatusString(e); }
inline bool ok(cudaError_t e) { return e == cudaSuccess; }
inline bool ok(ncclResult_t e) { return e == ncclSuccess; }
inline bool ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

template <typename Status>
[[noreturn]] void fail(Status status, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear the sticky error
  throw Error(str(expr, " failed at ", file, ":", line, ": ", status_string(status), " (", static_cast<int>(status), ")"));
}

}  // namespace stp::cuda

#define STP_CUDA_CHECK(expr)                                                        \
  do {                                                                              \
    auto _stp_status = (expr);                                                      \
    if (!::stp::cuda::ok(_stp_status)) ::stp::cuda::fail(_stp_status, #expr, __FILE__, __LINE__); \
  } while (0)
