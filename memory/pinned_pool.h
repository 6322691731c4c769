// PinnedPool: the pinned host memory that activation offload copies into and out of.
//
//   * One allocation at start-up: the whole pool is taken as a single pinned segment, so any
//     request up to capacity() can be served and no pinning (an expensive, serialising system
//     call on CUDA) happens during training. It never grows.
//   * Carving: first fit (lowest address), so stats().high_water is the pool size a run needs.
//   * Placement: the segment is fresh anonymous memory (mmap), bound to the NUMA node nearest the
//     device (memory/numa.h) and pre-faulted chunk by chunk so every page exists, on that node,
//     before it is pinned (Device::register_pinned_host; CUDA: cudaHostRegister) — pinned pages
//     do not migrate, so the order matters. numa_node() is where the kernel says the pages are
//     (memory_node_of), not where they were asked to be; -1 if unknown. Dry-run devices hand out
//     address ranges only (allocate_pinned_host): nothing is mapped.
//   * Budget: the pool counts against memory.host_budget. A pool larger than the budget is a
//     configuration error (stp::Error naming both sizes and the knob) raised before any memory is
//     taken; a request the pool cannot serve throws OutOfMemoryError with the arena's report.
//   * Stream-ordered reuse (memory/block_arena.h): a buffer returns to the pool when its last
//     reference drops, but bytes reused on another stream make that stream wait for every stream
//     that used them (Storage::record_use) — a D2H copy into a reused buffer never overtakes the
//     H2D copy still reading it.
//
// Thread-safe. The device and the home stream must outlive the pool and its buffers.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/block_arena.h"

namespace stp {

struct PinnedPoolOptions {
  std::size_t bytes = 0;                  // pool size, allocated once at construction
  std::size_t host_budget = SIZE_MAX;     // memory.host_budget (the limit the pool must fit)
  std::size_t chunk_bytes = 64ull << 20;  // NUMA bind / pre-fault granularity
};

class PinnedPool final : public Allocator {
 public:
  // `home`: the stream buffers are ordered on unless allocate_on() names another (the D2H stream).
  PinnedPool(Device& device, Stream& home, PinnedPoolOptions options);
  ~PinnedPool() override;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  std::shared_ptr<Storage> allocate(std::size_t bytes) override;  // first user: the home stream
  std::shared_ptr<Storage> allocate_on(std::size_t bytes, Stream& first_user) override;
  Device& device() override;

  ArenaStats stats() const;
  // Counters trace::track::kPinnedMemory for rank `pid` (BlockArena::set_trace); nullptr detaches.
  void set_trace(TraceRecorder* recorder, int pid) { arena_->set_trace(recorder, pid, trace::track::kPinnedMemory); }
  std::size_t capacity() const { return capacity_; }  // bytes of the one segment
  int numa_node() const { return numa_node_; }        // where the pages are; -1 if unknown
  bool numa_bound() const { return numa_bound_; }     // true: bound by policy, not just placed

 private:
  Device& device_;
  std::size_t capacity_ = 0;
  int numa_node_ = -1;
  bool numa_bound_ = false;
  std::unique_ptr<BlockArena> arena_;
};

}  // namespace stp
