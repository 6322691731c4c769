// Entry points of the CUDA backend (built only with STP_HAVE_CUDA). This header includes no
// CUDA headers, so core/backend.cpp can call it from plain C++.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/device.h"

namespace stp {

// True when the driver/runtime work and at least `needed` GPUs are visible; otherwise `why`
// holds what was found ("no CUDA driver: ...", "1 GPU visible, 4 needed", ...).
bool cuda_devices_usable(int needed, std::string* why);

// GPUs this process sees (CUDA_VISIBLE_DEVICES applied); 0 when the runtime cannot tell.
int cuda_visible_gpus();

// The name of visible GPU `ordinal` (cudaGetDeviceProperties), without making a context current.
std::string cuda_device_name(int ordinal);

// GPUs first..first+count-1, each with a memory limit of min(capacity, free memory at start-up).
std::vector<std::unique_ptr<Device>> make_cuda_devices(int count, std::size_t capacity, int first = 0);

// One NCCL communicator group over the given CUDA devices of this process (ncclCommInitAll).
// split_parent: created with ncclConfig_t::splitShare = 1 (core/backend.h, make_split_parent_comms).
std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<Device*>& devices,
                                                           bool split_parent = false);

// Whether the NCCL library linked at run time has ncclCommSplit with splitShare (2.18 or later);
// otherwise `why` names the version.
bool nccl_split_available(std::string* why);

// core/backend.h, split_comms, on NcclComm parents.
std::vector<std::unique_ptr<Communicator>> split_nccl_comms(const std::vector<Communicator*>& parents,
                                                            const std::vector<int>& colors,
                                                            const std::vector<int>& keys, bool share);

// Polls every NCCL communicator of GPU `ordinal` for an asynchronous error (a failed peer or
// network: ncclCommGetAsyncError); on one, aborts that communicator and throws DeviceError.
// CudaStream::synchronize calls it while it waits, so such a failure ends the step instead of
// hanging in a stream wait (docs/gpu-readiness.md, How a CUDA failure reaches the user).
void nccl_poll_async_errors(int ordinal);

// NCCL across processes (one GPU per process): the group's rank 0 creates the unique id, the
// caller broadcasts its bytes to every member (process/mpi/ does it over MPI), and every member then
// joins with make_nccl_comm_rank (ncclCommInitRank, collective over the members).
std::vector<char> nccl_unique_id();
std::size_t nccl_unique_id_size();
std::unique_ptr<Communicator> make_nccl_comm_rank(Device& device, int size, int rank,
                                                  const std::vector<char>& unique_id, bool split_parent = false);

}  // namespace stp
