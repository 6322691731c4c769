#include "core/backend.h"

#include "core/cpu/cpu_device.h"
#include "core/cpu/dry_stream.h"
#include "core/gpu_logic.h"
#include "base/error.h"
#if defined(STP_HAVE_CUDA)
#include "core/cuda/cuda_backend.h"
#endif

namespace stp {

bool cuda_built() {
#if defined(STP_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

bool cuda_usable(int needed, std::string* why) {
#if defined(STP_HAVE_CUDA)
  return cuda_devices_usable(needed, why);
#else
  if (why)
    *why =
        "this stp was built without the CUDA backend (no nvcc at configure time, -DSTP_CUDA=OFF or a sanitizer build)";
  (void)needed;
  return false;
#endif
}

std::string cuda_gpu_name() {
#if defined(STP_HAVE_CUDA)
  static const std::string name = cuda_usable(1, nullptr) ? cuda_device_name(0) : std::string();
  return name;
#else
  return {};
#endif
}

std::vector<std::unique_ptr<Device>> make_devices(const BackendOptions& o) {
  STP_CHECK(o.count >= 1, "need at least one device, got ", o.count);
  std::vector<std::unique_ptr<Device>> out;
  if (o.kind == DeviceKind::Cpu || o.dry_run) {
    CpuDeviceOptions cpu;
    cpu.capacity = o.capacity;
    cpu.link_bytes_per_s = o.link_bytes_per_s;
    cpu.dry_run = o.dry_run;
    for (auto& d : make_cpu_devices(o.count, cpu, o.first)) out.push_back(std::move(d));
    return out;
  }
  std::string why;
  if (!cuda_usable(o.count, &why))
    throw Error(str("parallel.backend is cuda but ", why, "; use parallel.backend: cpu or run on a GPU machine"));
#if defined(STP_HAVE_CUDA)
  // o.first is this process's rank on its node: which visible GPUs it drives (gpu::select_gpu,
  // docs/gpu-readiness.md section 8, finding 7).
  out = make_cuda_devices(o.count, o.capacity, gpu::select_gpu(cuda_visible_gpus(), o.first, o.count));
#endif
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_comms(const std::vector<Device*>& devices,
                                                      const HostCommOptions& host) {
  STP_CHECK(!devices.empty(), "a communicator needs at least one device");
  DeviceKind kind = devices.front()->kind();
  for (auto* d : devices) STP_ASSERT(d->kind() == kind, "communicator over mixed device kinds");
  if (kind == DeviceKind::Cpu) {
    if (is_dry(*devices.front())) return make_null_comms(static_cast<int>(devices.size()));
    return make_host_comms(static_cast<int>(devices.size()), host);
  }
#if defined(STP_HAVE_CUDA)
  if (devices.size() == 1) {
    std::vector<std::unique_ptr<Communicator>> one;
    one.push_back(make_self_comm());
    return one;
  }
  return make_nccl_comms(devices);
#else
  STP_UNREACHABLE("CUDA device in a build without CUDA");
  return {};
#endif
}

std::unique_ptr<Communicator> make_self_comm() { return std::move(make_null_comms(1).front()); }

bool comm_split_available(DeviceKind kind, std::string* why) {
  if (kind != DeviceKind::Cuda) return false;
#if defined(STP_HAVE_CUDA)
  return nccl_split_available(why);
#else
  if (why) *why = "this stp was built without the CUDA backend";
  return false;
#endif
}

std::vector<std::unique_ptr<Communicator>> make_split_parent_comms(const std::vector<Device*>& devices) {
  STP_CHECK(devices.size() >= 2, "a split parent needs two or more devices, got ", devices.size());
  for (auto* d : devices) STP_ASSERT(d->kind() == DeviceKind::Cuda, "split parents are NCCL communicators");
#if defined(STP_HAVE_CUDA)
  return make_nccl_comms(devices, /*split_parent=*/true);
#else
  STP_UNREACHABLE("CUDA device in a build without CUDA");
  return {};
#endif
}

std::vector<std::unique_ptr<Communicator>> split_comms(const std::vector<Communicator*>& parents,
                                                       const std::vector<int>& colors, const std::vector<int>& keys,
                                                       bool share) {
  STP_ASSERT(parents.size() == colors.size() && parents.size() == keys.size(), "split_comms: ", parents.size(),
             " parents, ", colors.size(), " colors, ", keys.size(), " keys");
#if defined(STP_HAVE_CUDA)
  return split_nccl_comms(parents, colors, keys, share);
#else
  (void)share;
  STP_UNREACHABLE("split_comms needs the CUDA backend");
  return {};
#endif
}

}  // namespace stp
