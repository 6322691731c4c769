// NUMA placement through hwloc: where pinned host memory and copy threads should live.
//
//   * One process-wide hwloc topology, loaded on first use (thread-safe) and read-only afterwards.
//   * Node numbers are the operating system's NUMA node numbers (hwloc os_index), -1 = unknown.
//   * "Not supported" is not an error: a kernel without NUMA policy calls (ENOSYS), a binding the
//     system cannot enforce (EXDEV) or a sandbox that forbids it (EPERM, e.g. a container without
//     CAP_SYS_NICE) makes bind_memory / bind_current_thread_near return false and leaves
//     placement to the OS; any other failure throws stp::Error with hwloc's errno message.
#pragma once

#include <cstddef>
#include <vector>

#include "core/device.h"

namespace stp {

// Number of NUMA nodes in the topology (1 on a machine without NUMA).
int numa_node_count();

// The NUMA node whose memory is nearest to `device`.
//   * The device's own answer when it has one and the node exists: Device::numa_node_hint (CUDA:
//     the GPU's PCI device, /sys/bus/pci/devices/<cudaDeviceGetPCIBusId>/numa_node).
//   * Otherwise (CPU backend, one-node machines, no sysfs): a node of the CPUs this process may
//     run on; devices are spread over those nodes round-robin by device index (with one node:
//     node 0), as GPUs hang off sockets.
int nearest_numa_node(const Device& device);

// Binds the pages of [p, p + bytes) to `node` and migrates those already resident
// (HWLOC_MEMBIND_BIND | MIGRATE). Pages touched afterwards are allocated there.
// true: bound. false: not supported here (see above) or node < 0. Throws stp::Error otherwise.
bool bind_memory(void* p, std::size_t bytes, int node);

// The NUMA node holding the resident pages of [p, p + bytes); -1 if unknown (no page resident,
// pages spread over several nodes, or the query is not supported).
int memory_node_of(const void* p, std::size_t bytes);

// Binds the calling thread to the CPUs of `node` (HWLOC_CPUBIND_THREAD). Same return contract as
// bind_memory; node < 0 is a no-op returning false.
bool bind_current_thread_near(int node);

// Binds the worker thread(s) behind `stream` to `node`'s CPUs by enqueueing a host task that
// calls bind_current_thread_near (on the CPU backend that task runs on the stream's own worker).
// Asynchronous like any stream work: a failure surfaces at the stream's next synchronize().
// Non-CPU streams are left alone (a CUDA host callback runs on a driver thread, not a copy engine).
void bind_stream_threads_near(Stream& stream, int node);

// The CPUs this process may run on, in increasing order: the affinity mask of the thread that
// first asks (taskset / numactl bindings count), remembered, so stp's own later bindings of the
// main thread (memory.copy_engine_cpus) do not shrink what the next trainer can split.
std::vector<int> allowed_cpus();

// Splits allowed_cpus() for an emulated copy engine (memory.copy_engine_cpus): the last
// `copy_cpus` CPUs for the D2H/H2D stream threads, the rest for everything else. Throws
// stp::Error naming the knob when that leaves no CPU for compute.
struct CpuSplit {
  std::vector<int> compute, copy;
};
CpuSplit split_cpus_for_copies(int copy_cpus);

// Binds the calling thread to exactly `cpus` (threads it creates later inherit the mask). Same
// return contract as bind_memory.
bool bind_current_thread_to_cpus(const std::vector<int>& cpus);

// Like bind_stream_threads_near, to exactly `cpus`.
void bind_stream_threads_to_cpus(Stream& stream, std::vector<int> cpus);

}  // namespace stp
