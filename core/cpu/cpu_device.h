// CpuDevice: an emulated device of the CPU backend — the oracle for every kernel, schedule and
// memory claim. N of them live in one process (make_cpu_devices), one per rank.
//
//   * Memory: host memory counted against a hard capacity; allocation beyond it throws
//     OutOfMemoryError naming requested, in use, capacity and peak. Counts are exact
//     (requested bytes), so budgets and peaks can be tested to the byte.
//   * Streams: one worker thread each, running its queue strictly in order. Copies, kernels and
//     GEMMs are asynchronous to the caller exactly as on CUDA.
//   * Events: shared state usable across streams and across devices. Records of one event are
//     expected to complete in record order (true for records made on one stream).
//   * Copy link model: with `link_bytes_per_s` > 0, copies between device memory and pinned host
//     memory take at least bytes / rate seconds, so PCIe-like offload overlap can be studied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <map>
#include <vector>

#include "core/device.h"
#include "core/gemm_shape.h"

namespace stp {

struct CpuDeviceOptions {
  std::size_t capacity = std::numeric_limits<std::size_t>::max();  // device memory limit
  double link_bytes_per_s = 0;                                     // D2H/H2D copy rate limit; 0 = memcpy speed
  bool lock_pinned = false;  // mlock() pinned host allocations (best effort, counted)
  bool dry_run = false;      // count allocations, run nothing (core/cpu/dry_stream.h)
  int numa_node = -1;        // Device::numa_node_hint: emulates a GPU's PCI locality (tests)
};

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, CpuDeviceOptions options);
  ~CpuDevice() override;

  DeviceKind kind() const override { return DeviceKind::Cpu; }
  int index() const override { return index_; }
  std::string name() const override;
  int numa_node_hint() const override { return options_.numa_node; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  MemoryStats memory_stats() const override;
  void reset_peak() override;

  void* allocate_pinned_host(std::size_t bytes) override;
  void deallocate_pinned_host(void* ptr) override;
  void register_pinned_host(void* ptr, std::size_t bytes) override;  // mlock-ed with lock_pinned
  void unregister_pinned_host(void* ptr) override;
  MemoryStats pinned_host_stats() const override;

  std::unique_ptr<Stream> create_stream(std::string name) override;
  std::unique_ptr<Event> create_event() override;
  std::unique_ptr<Event> create_timing_event() override;

  const CpuDeviceOptions& options() const { return options_; }
  bool is_pinned_host(const void* ptr) const;  // ptr lies inside a pinned host allocation
  std::uint64_t lock_failures() const;         // mlock() refusals (lock_pinned only)
  // The GEMM shapes chosen on this device (Stream::prepare_gemm; core/gemm_shape.h), as cuBLASLt's
  // cache would hold them, so the late choices count as on a GPU.
  GemmChoices& gemm_choices() { return gemm_choices_; }

 private:
  struct Space {  // one memory space: device or pinned host
    MemoryStats stats;
    std::map<const char*, std::size_t> live;  // base -> bytes, ordered for lookups
  };
  void* allocate_in(Space& space, std::size_t bytes, const char* what, void* given = nullptr);
  std::size_t release_in(Space& space, void* ptr, const char* what, bool owned = true);

  int index_;
  CpuDeviceOptions options_;
  mutable std::mutex mu_;
  Space device_;
  Space pinned_;
  std::uint64_t lock_failures_ = 0;
  std::map<const char*, std::size_t> registered_;  // pinned_.live entries the caller owns
  std::uintptr_t next_fake_ = 1ull << 44;          // dry run: addresses handed out, never dereferenced
  GemmChoices gemm_choices_;
};

std::vector<std::unique_ptr<CpuDevice>> make_cpu_devices(int count, const CpuDeviceOptions& options = {},
                                                         int first = 0);

}  // namespace stp
