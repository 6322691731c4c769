// cuDNN, loaded at run time, and what the CUDA backend asks of it (fused attention): the parts
// that need no GPU, in a header without CUDA or cuDNN headers, so tests and tools can check them.
//
// Loading: the library is opened with dlopen (libcudnn.so.9 by default), never linked, so a binary
// built with the CUDA backend starts where cuDNN is missing. Its run-time version
// (cudnnGetVersion) must be at least kMinCudnnVersion and not a release with a known defect
// (cudnn_version_defect). A missing library, a missing symbol or such a version makes cuDNN unusable: cudnn_status()
// then prints one line to stderr, once per process, naming what was found and that the fused attention runs stp's own
// CUDA kernel; nothing fails and nothing aborts.
#pragma once

#include <cstddef>
#include <string>

#include "core/device.h"

namespace stp {

// The oldest cuDNN whose fused flash attention stp uses: 9.1.0. The composite SDPA graph with a
// causal mask, GQA and the softmax statistics is what cudnn-frontend builds for every cuDNN 9
// release, with -inf as the mask value from 9.1 (older releases wanted the lowest float).
inline constexpr std::size_t kMinCudnnVersion = 90100;

// Why cuDNN `version` must not run the fused attention although it is new enough, or "": 9.10.0
// and 9.10.1 have known defects in the bf16 forward (cudnn-frontend refuses both).
std::string cudnn_version_defect(std::size_t version);

// The library that cudnn_status() opens.
inline constexpr const char* kCudnnLibrary = "libcudnn.so.9";

// What opening one cuDNN library found.
struct CudnnStatus {
  bool usable = false;
  std::size_t version = 0;  // cudnnGetVersion(), e.g. 91900; 0 when not loaded
  std::string library;      // the name given to dlopen
  std::string why;          // empty when usable: "dlopen libcudnn.so.9: <dlerror>", "... older than 9.1.0"
};

// "9.19.0" for 91900.
std::string cudnn_version_string(std::size_t version);

// Opens `library` and checks its symbols and version; never throws for a missing or old library.
// The handle stays open (the process's functions point into it). Prints nothing.
CudnnStatus probe_cudnn(const std::string& library);

// The one line that says cuDNN is unusable and what runs instead, e.g. "stp: cuDNN not found
// (dlopen libcudnn.so.9: ...); fused attention runs stp's own CUDA kernel".
std::string cudnn_fallback_line(const CudnnStatus& status);

// The process's cuDNN (kCudnnLibrary, opened on the first call; thread-safe). When it is unusable
// the first call prints cudnn_fallback_line to stderr; later calls print nothing.
const CudnnStatus& cudnn_status();

// The descriptors of cuDNN's fused-attention graphs that can be made without a GPU: every tensor
// and operation descriptor of the forward (or backward) graph of `shape`, each finalized (the
// operation graph, the engines and the plans need a cuDNN handle, that is a GPU). Throws
// InternalError naming the descriptor cuDNN refused. Requires cudnn_status().usable.
struct CudnnGraphCounts {
  int tensors = 0, operations = 0;
};
CudnnGraphCounts check_cudnn_attention_descriptors(const AttentionShape& shape, bool backward);

}  // namespace stp
