// Backend selection: creates the devices of one process and the communicators between them,
// for the CPU backend (emulated devices) or the CUDA backend (GPUs + NCCL), behind one API.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/device.h"

namespace stp {

struct BackendOptions {
  DeviceKind kind = DeviceKind::Cpu;
  int count = 1;  // devices (ranks) to create
  int first = 0;  // CPU: number of the first device. CUDA: this process's rank on its node
                  // (process/process.h); the GPUs it drives follow gpu::select_gpu (core/gpu_logic.h):
                  // GPU 0 when only `count` GPUs are visible, else GPUs first·count...
  std::size_t capacity = std::numeric_limits<std::size_t>::max();  // per-device memory limit
  double link_bytes_per_s = 0;                                     // CPU only: emulated D2H/H2D rate
  bool dry_run = false;  // CPU devices that count allocations and run nothing, for any `kind`
                         // (core/cpu/dry_stream.h); their communicators do nothing
};

// Throws stp::Error with one clear line when the backend cannot provide `count` devices
// (e.g. backend cuda on a build without CUDA or a machine without a usable GPU/driver).
std::vector<std::unique_ptr<Device>> make_devices(const BackendOptions& options);

// One communicator group over `devices` (rank i = devices[i]); all of one kind.
// CPU: HostComm. CUDA: NCCL (ncclCommInitAll over the devices' ordinals), except a group of one
// device, which gets make_self_comm().
// `host` configures the CPU backend's emulated link (ignored on CUDA).
std::vector<std::unique_ptr<Communicator>> make_comms(const std::vector<Device*>& devices,
                                                      const HostCommOptions& host = {});

// The communicator of a group of one rank: every collective over one rank is the identity and no
// message can be sent, so it does nothing (and takes no memory). For GPU groups of one: a
// one-rank NCCL communicator still allocates NCCL's buffers and loads its kernels (on an H200
// the two one-rank groups of a one-GPU job took 1992 MiB), for operations that change nothing.
std::unique_ptr<Communicator> make_self_comm();

// ---- Groups split from one world communicator (CUDA; core/gpu_logic.h, plan_splits) ----

// Whether `kind` derives its groups with split_comms: CUDA with NCCL 2.18 or later (ncclCommSplit
// and ncclConfig_t::splitShare). Otherwise (the CPU backend, older NCCL) every group is made on its
// own (make_comms, ProcessGroup::make_comm); `why` says why for CUDA.
bool comm_split_available(DeviceKind kind, std::string* why);

// As make_comms over two or more CUDA devices, but the communicators are split parents: created
// with ncclConfig_t::splitShare = 1, so the children split from them share their resources.
std::vector<std::unique_ptr<Communicator>> make_split_parent_comms(const std::vector<Device*>& devices);

// One ncclCommSplit call. parents[i]: this process's members of one split parent (or of a child of
// one), each on its own device; colors[i] / keys[i]: its color (gpu::kSplitNoColor: no child) and
// key. Collective over every rank of the parent: every process makes the same calls in the same
// order, each with all its members. Returns [i] the child of parents[i], or nullptr. `share`: the
// children are split parents themselves (their children would share their resources).
std::vector<std::unique_ptr<Communicator>> split_comms(const std::vector<Communicator*>& parents,
                                                       const std::vector<int>& colors, const std::vector<int>& keys,
                                                       bool share);

// Owns communicators and destroys them in the reverse order of adding them, so a communicator is
// destroyed before the one it was split from (NCCL: children before their parent).
class CommunicatorList {
 public:
  CommunicatorList() = default;
  CommunicatorList(const CommunicatorList&) = delete;
  CommunicatorList& operator=(const CommunicatorList&) = delete;
  ~CommunicatorList() { clear(); }
  void push_back(std::unique_ptr<Communicator> c) { list_.push_back(std::move(c)); }
  void clear() {
    while (!list_.empty()) list_.pop_back();
  }
  std::size_t size() const { return list_.size(); }
  auto begin() { return list_.begin(); }
  auto end() { return list_.end(); }

 private:
  std::vector<std::unique_ptr<Communicator>> list_;
};

// Whether this build has the CUDA backend, and whether a GPU is usable; `why` says why not.
bool cuda_built();
bool cuda_usable(int needed, std::string* why);
// The first visible GPU's name as the CUDA runtime reports it ("NVIDIA H100 80GB HBM3"), asked
// once per process; "" without the CUDA backend or a usable GPU.
std::string cuda_gpu_name();

}  // namespace stp
