// The cuDNN functions stp calls, as pointers into the library cudnn_status() opened
// (core/cuda/cudnn_library.h), and an owning handle of one backend descriptor (CUDA-only
// translation units). cuDNN's headers give the types and the declarations the pointers are typed
// by; nothing links against libcudnn.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <string>

namespace stp {

struct CudnnApi {
  decltype(&::cudnnGetVersion) GetVersion = nullptr;
  decltype(&::cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&::cudnnCreate) Create = nullptr;
  decltype(&::cudnnDestroy) Destroy = nullptr;
  decltype(&::cudnnSetStream) SetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) BackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) BackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendFinalize) BackendFinalize = nullptr;
  decltype(&::cudnnBackendSetAttribute) BackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) BackendGetAttribute = nullptr;
  decltype(&::cudnnBackendExecute) BackendExecute = nullptr;
};

// The process's functions; cudnn_status().usable must hold.
const CudnnApi& cudnn_api();

// Throws InternalError naming `what`, cuDNN's status and its last error message, unless s succeeded.
void cudnn_check(cudnnStatus_t s, const std::string& what);

// One backend descriptor, destroyed with its owner. set() and finalize() throw (cudnn_check) with
// the descriptor's name and the attribute in the message.
class CudnnDesc {
 public:
  CudnnDesc() = default;
  CudnnDesc(cudnnBackendDescriptorType_t type, std::string name);
  ~CudnnDesc();
  CudnnDesc(CudnnDesc&& o) noexcept : d_(o.d_), name_(std::move(o.name_)) { o.d_ = nullptr; }
  CudnnDesc& operator=(CudnnDesc&& o) noexcept;
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  const std::string& name() const { return name_; }
  CudnnDesc& set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, std::int64_t count,
                 const void* values);
  CudnnDesc& set_desc(cudnnBackendAttributeName_t attr, const CudnnDesc& value);
  CudnnDesc& set_int(cudnnBackendAttributeName_t attr, std::int64_t value);
  CudnnDesc& set_type(cudnnBackendAttributeName_t attr, cudnnDataType_t value);
  CudnnDesc& finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string name_;
};

}  // namespace stp
