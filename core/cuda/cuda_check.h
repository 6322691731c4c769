// Error checks for CUDA, cuBLASLt and NCCL calls (CUDA-only translation units).
// One generic macro: a failure throws naming the call, its status and message, after clearing
// CUDA's non-sticky "last error" so later calls report their own failures. What it throws
// depends on the status (base/error.h, docs/architecture.md "Error model"):
//   * out of memory (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED): OutOfMemoryError,
//     with the GPU's free and total memory and what to change — device memory a CUDA library
//     allocates itself lies outside memory.device_budget (docs/gpu-readiness.md, Memory);
//   * an invalid argument or usage (cudaErrorInvalidValue, ...InvalidDevicePointer,
//     ...InvalidResourceHandle, CUBLAS_STATUS_INVALID_VALUE, ncclInvalidArgument,
//     ncclInvalidUsage): InternalError — stp passed it, so it is a bug in stp (exit status 3);
//   * anything else (launch failures, illegal addresses, driver, hardware, NCCL system and
//     remote errors): DeviceError (exit status 4); NCCL's CUDA/system errors name the GPU's
//     free memory, since NCCL reports its own failed allocations that way.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <type_traits>

#include "base/error.h"
#include "core/gpu_logic.h"

namespace stp::cuda {

enum class Failure { Device, OutOfMemory, Bug };

inline const char* status_string(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* status_string(ncclResult_t e) { return ncclGetErrorString(e); }
inline const char* status_string(cublasStatus_t e) { return cublasLtGetStatusString(e); }
inline bool ok(cudaError_t e) { return e == cudaSuccess; }
inline bool ok(ncclResult_t e) { return e == ncclSuccess; }
inline bool ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

inline Failure failure_of(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return Failure::OutOfMemory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection: return Failure::Bug;
    default: return Failure::Device;
  }
}
inline Failure failure_of(cublasStatus_t e) {
  switch (e) {
    case CUBLAS_STATUS_ALLOC_FAILED: return Failure::OutOfMemory;
    case CUBLAS_STATUS_INVALID_VALUE: return Failure::Bug;
    default: return Failure::Device;
  }
}
inline Failure failure_of(ncclResult_t e) {
  switch (e) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return Failure::Bug;
    default:  // NCCL reports a failed cudaMalloc as ncclUnhandledCudaError: the message says so
      return Failure::Device;
  }
}

// Errors after which the CUDA context is unusable: every later call of the process fails with the
// same error until it exits (CUDA Runtime API, Error Handling: "sticky" errors). They poison
// device_health() so destructors release nothing instead of throwing echoes (finding 2,
// docs/gpu-readiness.md section 8).
inline bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed: return true;
    default: return false;
  }
}
template <typename Status>
bool is_sticky(Status) {
  return false;
}

// The calling thread's last error through core/gpu_logic.h (finding 1).
inline gpu::LastError last_error() {
  gpu::LastError l;
  l.success = cudaSuccess;
  l.not_ready = cudaErrorNotReady;
  l.take = [] { return static_cast<int>(cudaGetLastError()); };
  l.describe = [](int e) { return std::string(cudaGetErrorString(static_cast<cudaError_t>(e))); };
  return l;
}

// "GPU N: X free of Y" for the calling thread's current device, or "" if CUDA cannot tell.
inline std::string memory_state() {
  int dev = -1;
  std::size_t free_b = 0, total = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return str("GPU ", dev, ": ", format_bytes(free_b), " free of ", format_bytes(total));
}

template <typename Status>
[[noreturn]] void fail(Status status, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear the non-sticky last error
  std::string what =
      str(expr, " failed at ", file, ":", line, ": ", status_string(status), " (", static_cast<int>(status), ")");
  switch (failure_of(status)) {
    case Failure::OutOfMemory: {
      std::string state = memory_state();
      throw OutOfMemoryError(str("out of device memory: ", what, state.empty() ? "" : "; ", state,
                                 ". CUDA libraries (the CUDA context, the cuBLASLt handle, NCCL buffers) allocate "
                                 "outside memory.device_budget: lower memory.device_budget to leave them room, "
                                 "or check nvidia-smi for other processes on this GPU"),
                             0);
    }
    case Failure::Bug:
      throw InternalError(str("internal error: ", what, " (stp passed an invalid argument to a CUDA library)"));
    case Failure::Device: break;
  }
  if (is_sticky(status)) gpu::device_health().poison(what);
  if constexpr (std::is_same_v<Status, ncclResult_t>) {
    // NCCL reports its own failed cudaMalloc (buffers for a connection made at the first
    // transfer) as an unhandled CUDA or system error: the memory state tells whether it was that.
    if (status == ncclUnhandledCudaError || status == ncclSystemError) {
      std::string state = memory_state();
      if (!state.empty())
        what += str("; ", state,
                    " (if NCCL could not allocate its buffers: they lie outside "
                    "memory.device_budget, so lower it)");
    }
  }
  throw DeviceError(what);
}

}  // namespace stp::cuda

#define STP_CUDA_CHECK(expr)                                                                      \
  do {                                                                                            \
    auto _stp_status = (expr);                                                                    \
    if (!::stp::cuda::ok(_stp_status)) ::stp::cuda::fail(_stp_status, #expr, __FILE__, __LINE__); \
  } while (0)

namespace stp::cuda {

// The calling thread's current GPU as stp last made it (-1: not known). CUDA's current device is
// per host thread and every enqueue must run with the stream's GPU current, but cudaSetDevice is
// a runtime call per launch even when nothing changes; so stp makes a GPU current only through
// set_device, which skips the call when this thread's cache already names the GPU. A library
// call that may change the device behind stp's back (NCCL's group calls that create
// communicators) is followed by forget_current_device().
inline thread_local int current_device = -1;

// Makes `ordinal` the calling thread's current GPU; throws as STP_CUDA_CHECK does.
inline void set_device(int ordinal) {
  if (current_device == ordinal) return;
  current_device = -1;  // unknown until the call succeeds
  STP_CUDA_CHECK(cudaSetDevice(ordinal));
  current_device = ordinal;
}

// Release paths (destructors): the same, ignoring a failure (the first error was thrown where
// it happened) and leaving the cache unknown after one.
inline void set_device_quietly(int ordinal) noexcept {
  if (current_device == ordinal) return;
  current_device = cudaSetDevice(ordinal) == cudaSuccess ? ordinal : -1;
  if (current_device < 0) (void)cudaGetLastError();
}

inline void forget_current_device() noexcept { current_device = -1; }

}  // namespace stp::cuda
