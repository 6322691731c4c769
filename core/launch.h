// Kernels written once for both backends.
//
// A kernel is a functor with `STP_HD void operator()(std::size_t i) const` that does element
// (or row) i. launch(stream, n, f) runs f(0..n-1) in stream order:
//   * CPU stream: one host task that splits [0, n) into grains across oneTBB workers;
//   * CUDA stream: one generic kernel, one thread per index (only in files compiled by nvcc:
//     name them *_kernels.cpp and the build compiles them as CUDA when the backend is on).
// So the math the CPU tests prove is the code the GPU runs. Functors capture raw pointers by
// value; buffers must outlive the stream work (see core/device.h).
//
// This is the index launch: one task per index on either backend. A kernel whose layout should
// differ by backend (whole rows per CPU task, one element per GPU thread, ...) names a launch
// shape instead (core/launch_shape.h), which chooses the layout and launches through this.
// launch_blocks<Threads>(stream, n, f) is the block launch behind RowBlock (core/launch_shape.h):
// one task per index on a CPU stream as well, but one block of Threads GPU threads per index on a
// CUDA stream, every thread calling f(index); the functor finds its thread through RowBlock, which
// runs the block's threads in turn on a CPU.
#pragma once

#include <cstddef>
#include <functional>

#include "core/device.h"
#include "core/dtype.h"  // STP_HD
#include "base/error.h"

namespace stp {

// CPU backend entry: enqueues one task on a CPU stream that runs body(begin, end) over [0, n)
// in chunks of at least `grain` indices, in parallel on oneTBB's workers.
void cpu_parallel_for(Stream& stream, std::size_t n, std::size_t grain,
                      std::function<void(std::size_t, std::size_t)> body);

#if defined(__CUDACC__)
template <typename F>
__global__ void stp_generic_kernel(std::size_t n, F f) {
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}
// One block of Threads threads per index: every thread of block b calls f(b).
template <unsigned Threads, typename F>
__global__ void __launch_bounds__(Threads) stp_block_kernel(F f) {
  f(static_cast<std::size_t>(blockIdx.x));
}
// Provided by core/cuda: the cudaStream_t of a CUDA stream (as void* to keep CUDA types out).
void* cuda_stream_handle(Stream& stream);
void cuda_check_before_launch(const char* kernel_name);  // a stale error is not the launch's
void cuda_check_launch(const char* kernel_name);
#endif

// Threads per block of a CUDA launch: whole warps, so a launch of a multiple of 32 indices runs
// whole warps only, and a launch of a multiple of kGpuBlockThreads whole blocks only (the reduction
// shapes of core/launch_shape.h rely on both).
constexpr unsigned kGpuBlockThreads = 256;
static_assert(kGpuBlockThreads % 32 == 0, "a block is whole warps");

// grain: minimum indices per CPU task (pick ~ 16K scalar ops of work per grain).
template <typename F>
void launch(Stream& stream, std::size_t n, F f, std::size_t grain = 4096) {
  if (n == 0) return;
  Device& device = stream.device();
  device.count_launch();
  if (device.kind() == DeviceKind::Cpu) {
    cpu_parallel_for(stream, n, grain, [f](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) f(i);
    });
    return;
  }
#if defined(__CUDACC__)
  constexpr unsigned threads = kGpuBlockThreads;
  unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  cudaStream_t handle = static_cast<cudaStream_t>(cuda_stream_handle(stream));
  cuda_check_before_launch(__PRETTY_FUNCTION__);
  stp_generic_kernel<<<blocks, threads, 0, handle>>>(n, f);
  cuda_check_launch(__PRETTY_FUNCTION__);
#else
  STP_UNREACHABLE("CUDA kernel launched from a file not compiled by nvcc (name it *_kernels.cpp)");
#endif
}

// Runs f(0..n-1) in stream order, one index per block of Threads threads: on a CPU stream as
// launch(stream, n, f, grain) runs it (the functor's block shape runs the block's threads in turn);
// on a CUDA stream as n blocks of Threads threads (n < 2^31). grain as above.
template <unsigned Threads, typename F>
void launch_blocks(Stream& stream, std::size_t n, F f, std::size_t grain = 1) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "a block is whole warps, at most 1024 threads");
  if (n == 0) return;
  Device& device = stream.device();
  device.count_launch();
  if (device.kind() == DeviceKind::Cpu) {
    cpu_parallel_for(stream, n, grain, [f](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) f(i);
    });
    return;
  }
#if defined(__CUDACC__)
  STP_ASSERT(n < (std::size_t{1} << 31), "launch_blocks: ", n, " blocks");
  cudaStream_t handle = static_cast<cudaStream_t>(cuda_stream_handle(stream));
  cuda_check_before_launch(__PRETTY_FUNCTION__);
  stp_block_kernel<Threads, F><<<static_cast<unsigned>(n), Threads, 0, handle>>>(f);
  cuda_check_launch(__PRETTY_FUNCTION__);
#else
  STP_UNREACHABLE("CUDA kernel launched from a file not compiled by nvcc (name it *_kernels.cpp)");
#endif
}

}  // namespace stp
