// Opening cuDNN at run time (core/cuda/cudnn_library.h) and the descriptor helpers of
// core/cuda/cudnn_api.h.
#include <dlfcn.h>

#include <cstdio>
#include <mutex>

#include "base/error.h"
#include "core/cuda/cudnn_api.h"
#include "core/cuda/cudnn_library.h"

namespace stp {

namespace {

struct Loaded {
  CudnnStatus status;
  CudnnApi api;
};

template <typename F>
bool symbol(void* lib, const char* name, F& f, std::string& why) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f) return true;
  if (why.empty()) why = str("symbol ", name, " missing");
  return false;
}

Loaded open_library(const std::string& library) {
  Loaded l;
  l.status.library = library;
  // RTLD_LOCAL: cuDNN's symbols stay out of the global namespace; the handle is never closed (the
  // process's function pointers point into it).
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.status.why = str("dlopen ", library, ": ", e ? e : "unknown error");
    return l;
  }
  std::string why;
  CudnnApi& a = l.api;
  const bool all =
      symbol(lib, "cudnnGetVersion", a.GetVersion, why) & symbol(lib, "cudnnGetErrorString", a.GetErrorString, why) &
      symbol(lib, "cudnnGetLastErrorString", a.GetLastErrorString, why) & symbol(lib, "cudnnCreate", a.Create, why) &
      symbol(lib, "cudnnDestroy", a.Destroy, why) & symbol(lib, "cudnnSetStream", a.SetStream, why) &
      symbol(lib, "cudnnBackendCreateDescriptor", a.BackendCreateDescriptor, why) &
      symbol(lib, "cudnnBackendDestroyDescriptor", a.BackendDestroyDescriptor, why) &
      symbol(lib, "cudnnBackendFinalize", a.BackendFinalize, why) &
      symbol(lib, "cudnnBackendSetAttribute", a.BackendSetAttribute, why) &
      symbol(lib, "cudnnBackendGetAttribute", a.BackendGetAttribute, why) &
      symbol(lib, "cudnnBackendExecute", a.BackendExecute, why);
  if (a.GetVersion) l.status.version = a.GetVersion();
  if (!all) {
    l.status.why = str(library, ": ", why);
    return l;
  }
  if (l.status.version < kMinCudnnVersion) {
    l.status.why = str(library, " is version ", cudnn_version_string(l.status.version), ", older than ",
                       cudnn_version_string(kMinCudnnVersion));
    return l;
  }
  if (std::string defect = cudnn_version_defect(l.status.version); !defect.empty()) {
    l.status.why = str(library, " is version ", cudnn_version_string(l.status.version), ", which ", defect);
    return l;
  }
  l.status.usable = true;
  return l;
}

Loaded& process_library() {
  static Loaded l = [] {
    Loaded r = open_library(kCudnnLibrary);
    if (!r.status.usable) std::fprintf(stderr, "%s\n", cudnn_fallback_line(r.status).c_str());
    return r;
  }();
  return l;
}

}  // namespace

std::string cudnn_version_string(std::size_t v) {
  // cuDNN 9: major * 10000 + minor * 100 + patch.
  return str(v / 10000, ".", v % 10000 / 100, ".", v % 100);
}

std::string cudnn_version_defect(std::size_t v) {
  if (v == 91000 || v == 91001) return "has known defects in the bf16 fused-attention forward (use 9.10.2 or later)";
  return {};
}

CudnnStatus probe_cudnn(const std::string& library) { return open_library(library).status; }

std::string cudnn_fallback_line(const CudnnStatus& s) {
  if (s.version == 0) return str("stp: cuDNN not found (", s.why, "); fused attention runs stp's own CUDA kernel");
  return str("stp: cuDNN not usable (", s.why, "); fused attention runs stp's own CUDA kernel");
}

const CudnnStatus& cudnn_status() { return process_library().status; }

const CudnnApi& cudnn_api() {
  const Loaded& l = process_library();
  STP_ASSERT(l.status.usable, "cuDNN functions used although cuDNN is unusable: ", l.status.why);
  return l.api;
}

void cudnn_check(cudnnStatus_t s, const std::string& what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  const CudnnApi& a = cudnn_api();
  char last[512] = {};
  a.GetLastErrorString(last, sizeof last);
  throw InternalError(str("cuDNN: ", what, ": ", a.GetErrorString(s), " (", static_cast<int>(s), ")",
                          last[0] ? str(": ", last) : std::string()));
}

CudnnDesc::CudnnDesc(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
  cudnn_check(cudnn_api().BackendCreateDescriptor(type, &d_), str("creating descriptor ", name_));
}

CudnnDesc::~CudnnDesc() {
  if (d_) (void)cudnn_api().BackendDestroyDescriptor(d_);
}

CudnnDesc& CudnnDesc::operator=(CudnnDesc&& o) noexcept {
  if (this != &o) {
    if (d_) (void)cudnn_api().BackendDestroyDescriptor(d_);
    d_ = o.d_;
    name_ = std::move(o.name_);
    o.d_ = nullptr;
  }
  return *this;
}

CudnnDesc& CudnnDesc::set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, std::int64_t count,
                          const void* values) {
  cudnn_check(cudnn_api().BackendSetAttribute(d_, attr, type, count, values),
              str("setting attribute ", static_cast<int>(attr), " of ", name_));
  return *this;
}

CudnnDesc& CudnnDesc::set_desc(cudnnBackendAttributeName_t attr, const CudnnDesc& value) {
  cudnnBackendDescriptor_t d = value.get();
  return set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

CudnnDesc& CudnnDesc::set_int(cudnnBackendAttributeName_t attr, std::int64_t value) {
  return set(attr, CUDNN_TYPE_INT64, 1, &value);
}

CudnnDesc& CudnnDesc::set_type(cudnnBackendAttributeName_t attr, cudnnDataType_t value) {
  return set(attr, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

CudnnDesc& CudnnDesc::finalize() {
  cudnn_check(cudnn_api().BackendFinalize(d_), str("finalizing ", name_));
  return *this;
}

}  // namespace stp
