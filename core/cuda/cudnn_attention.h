// CudnnAttention: the fused causal attention of one GPU through cuDNN's flash-attention engines
// (CUDA-only translation units; the problem is core/device.h's AttentionShape).
//
// Contract:
//   * one cuDNN handle per device, created with the device current; the stream is set on the
//     handle before each execution (under the object's lock), so any stream of the device can run it;
//   * the forward and backward graphs are cuDNN's composite SDPA pattern (docs/gpu-readiness.md,
//     Attention): Q K^T in f32, times 1/sqrt(D) (a by-value scalar), the causal mask (row >= column,
//     else -inf), the softmax with its statistics, P V; the backward is the deterministic form
//     (dQ straight from dS K, no f32 atomics), with GQA's per-head dK/dV summed by a reduction;
//   * q, k, v, o and their gradients are read and written in place with their row strides; the
//     forward's statistics tensor (B, NH, T, 1) f32 with strides (NH*T, T, 1, 1) is the lse record;
//   * plans are chosen once per (shape, workspace offered), cached: the engines cuDNN's heuristics
//     rank (mode A, then its fallback list), in that order, skipping any whose numerical notes say
//     NONDETERMINISTIC, any that does not finalize, and any whose workspace exceeds what the stream
//     offers; the first engine left wins. A shape with no engine left, for either pass, is
//     refused as a whole (prepare returns false; one line to stderr names the shape and why);
//   * prepare prints, once per shape and process, the engines chosen and their workspaces (the
//     line tools/gpu-bench reads to say which path ran).
// Thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/device.h"

namespace stp {

class CudnnAttention {
 public:
  explicit CudnnAttention(int ordinal);  // the device `ordinal` is current; cudnn_status().usable
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN runs `shape` with `workspace_bytes` of scratch (builds and caches the plans).
  bool prepare(const AttentionShape& shape, std::size_t workspace_bytes);
  // Enqueue one pass on `stream`; the shape must have been prepared with the same workspace size
  // and accepted. `workspace`: workspace_bytes of device memory.
  void forward(cudaStream_t stream, const AttentionForwardArgs& a, void* workspace, std::size_t workspace_bytes);
  void backward(cudaStream_t stream, const AttentionBackwardArgs& a, void* workspace, std::size_t workspace_bytes);

  struct Plans;  // the graphs, engines and plans of one shape (cudnn_attention.cu)

 private:
  const Plans& plans(const AttentionShape& shape, std::size_t workspace_bytes);  // under mu_

  int ordinal_;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::mutex mu_;
  std::map<std::pair<AttentionShape, std::size_t>, std::unique_ptr<Plans>> cache_;
};

}  // namespace stp
