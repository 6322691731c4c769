// AdamW on host memory: the device kernel's update (core/kernels/optim_kernels.h, adamw_step)
// run by the CPU itself, for optimizer state that lives in host memory.
//
// Contract:
//   * Bitwise the CPU backend's adamw_step: the same f32 operations in the same order, each
//     rounded on its own (no fused multiply-add: the vector code uses separate multiply and add
//     instructions, and this file and the device kernel's are compiled with -ffp-contract=off;
//     sqrt and divide are IEEE correctly rounded in every instruction set used). Whatever the
//     instruction set, thread count or split, every element gets the same bits.
//   * Parallel over oneTBB's workers (the calling thread's arena), in blocks of kCpuAdamWGrain
//     elements; vectorized with AVX-512F or AVX2 when the CPU has them (chosen at run time, capped
//     by STP_CPU_ISA: core/kernels/cpu_isa.h), a scalar loop otherwise and for the tails.
//   * Synchronous: returns when every element is updated. Any contiguous range may be updated
//     on its own (a chunk of a larger flat buffer, e.g. while other chunks are still in flight).
//
// CpuAdamWState holds exp_avg / exp_avg_sq for a list of flat buffers in page-aligned host memory
// bound to one NUMA node (memory/numa.h: nearest_numa_node(device) is the node for a device's
// optimizer; on the CPU backend that is a node of the CPUs this process may run on, devices
// spread over them round-robin, so on a one-node machine it is node 0).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/kernels/adamw_ranges.h"
#include "core/kernels/optim_kernels.h"

namespace stp {

// Elements per parallel task.
constexpr std::size_t kCpuAdamWGrain = std::size_t{1} << 15;

// Runs fn(begin, end) over [0, n) in blocks of kCpuAdamWGrain elements on oneTBB's workers (the
// calling thread's arena; a simple partitioner, so the blocks are exactly those), or on the calling
// thread alone when n fits one block. The CPU optimizer's element loops share this split. Under
// ThreadSanitizer the blocks run in order on the calling thread (oneTBB is not instrumented).
void for_cpu_blocks(std::size_t n, const std::function<void(std::size_t begin, std::size_t end)>& fn);

// One AdamW update of n elements (p, g, m, v: host memory, n floats each; p, m, v updated in
// place); c from adamw_scalars(lr, hyper, step, decay). isa must be one cpu_has_isa accepts
// (stp::Error otherwise). parallel = false runs on the calling thread only.
void cpu_adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWScalars& c,
                      CpuIsa isa = best_cpu_isa(), bool parallel = true);

// cpu_adamw_update into copies of the state: per block, m_from and v_from (and p_from when given)
// are copied into m, v (and p) and the block is updated there, while it is in cache; m_from,
// v_from and p_from are left unchanged, and p is updated in place when p_from is null. The
// result is bitwise cpu_adamw_update's on the sources (the element formula is applied to the same
// values; where they sit does not change its bits).
void cpu_adamw_update_copy(float* p, const float* p_from, const float* g, float* m, const float* m_from, float* v,
                           const float* v_from, std::size_t n, const AdamWScalars& c);

// Zeroed exp_avg / exp_avg_sq for buffers of the given element counts, on NUMA node `node`
// (-1: wherever the OS puts them; a node the system cannot bind to is left to the OS as well).
class CpuAdamWState {
 public:
  CpuAdamWState(const std::vector<std::size_t>& sizes, int node);
  ~CpuAdamWState();
  CpuAdamWState(const CpuAdamWState&) = delete;
  CpuAdamWState& operator=(const CpuAdamWState&) = delete;

  std::size_t count() const { return sizes_.size(); }
  std::size_t size(std::size_t i) const { return sizes_[i]; }  // elements
  float* exp_avg(std::size_t i) const { return m_[i]; }
  float* exp_avg_sq(std::size_t i) const { return v_[i]; }
  std::size_t bytes() const { return bytes_; }  // mapped, both moments of every buffer
  bool bound() const { return bound_; }         // whether the pages were bound to the node

 private:
  std::vector<std::size_t> sizes_;
  std::vector<float*> m_, v_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool bound_ = false;
};

}  // namespace stp
