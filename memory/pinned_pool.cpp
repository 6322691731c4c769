#include "memory/pinned_pool.h"

#include <unistd.h>

#include <algorithm>

#include "core/cpu/dry_stream.h"
#include "core/error.h"
#include "memory/numa.h"

namespace stp {

namespace {

constexpr std::size_t kBlockAlign = 256;  // BlockArena's block alignment: the segment is rounded to it

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

// Writes one byte per page, so the kernel allocates every page now — on the node the range is
// bound to — instead of on first use by a copy (a reading touch would only map the zero page).
void prefault(char* p, std::size_t bytes) {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  volatile char* q = p;
  for (std::size_t off = 0; off < bytes; off += page) q[off] = 0;
  if (bytes) q[bytes - 1] = 0;  // the last page when p is not page-aligned
}

// Where the segment ended up; filled by the arena's `take`, which runs inside the constructor.
struct Placement {
  int node = -1;
  bool bound = false;
};

}  // namespace

PinnedPool::PinnedPool(Device& device, Stream& home, PinnedPoolOptions options)
    : device_(device) {
  STP_CHECK(options.chunk_bytes > 0, "pinned host pool: chunk_bytes must be positive");
  capacity_ = round_up(options.bytes, kBlockAlign);
  // Checked before any memory is taken, so a misconfigured run pins nothing.
  STP_CHECK(capacity_ <= options.host_budget, "the pinned host pool needs ", format_bytes(capacity_),
            " but memory.host_budget = ", format_bytes(options.host_budget),
            "; raise memory.host_budget or offload fewer activations (memory.offload)");

  const int nearest = nearest_numa_node(device);
  auto placement = std::make_shared<Placement>();
  ArenaOptions a;
  a.what = "pinned host";
  a.budget_knob = "memory.host_budget";
  a.budget = options.host_budget;  // reports show the knob's value; grow=false caps at capacity_
  a.grow = false;
  // Lowest-address fit: the layout does not depend on the pool's size, so stats().high_water of a
  // run with a generous pool is exactly the pool that run needs (block_arena.h, first_fit).
  a.first_fit = true;
  a.first_fit = true;  // layout independent of the pool size: a dry run's high_water is the exact size
  a.advice = "Raise memory.host_budget.";
  // The arena's state may outlive this object (storages keep it), so the backend captures values
  // only. `take` runs once, from reserve() below.
  a.take = [&device, nearest, chunk = options.chunk_bytes, placement](std::size_t bytes) -> void* {
    char* p = static_cast<char*>(device.allocate_pinned_host(bytes));
    if (is_dry(device)) return p;  // no memory behind it: nothing to place or touch
    try {
      // Bind before touching: untouched pages are then allocated on the node directly. Pages the
      // backend already faulted in (CpuDevice mlock()s with lock_pinned; a recycled heap range)
      // are migrated (HWLOC_MEMBIND_MIGRATE). Chunks bound each system call and page-walk.
      bool bound = nearest >= 0;
      for (std::size_t off = 0; off < bytes; off += chunk) {
        std::size_t len = std::min(chunk, bytes - off);
        if (bound) bound = bind_memory(p + off, len, nearest);
        prefault(p + off, len);
      }
      placement->bound = bound;
      // Unbound (not supported here): report where first touch put the pages, if hwloc can tell.
      placement->node = bound ? nearest : memory_node_of(p, bytes);
    } catch (...) {
      device.deallocate_pinned_host(p);
      throw;
    }
    return p;
  };
  a.give = [&device](void* p) { device.deallocate_pinned_host(p); };
  arena_ = std::make_unique<BlockArena>(device, home, std::move(a));
  arena_->reserve(capacity_);
  numa_node_ = placement->node;
  numa_bound_ = placement->bound;
}

PinnedPool::~PinnedPool() = default;

std::shared_ptr<Storage> PinnedPool::allocate(std::size_t bytes) { return arena_->allocate(bytes); }

std::shared_ptr<Storage> PinnedPool::allocate_on(std::size_t bytes, Stream& first_user) {
  return arena_->allocate_on(bytes, first_user);
}

Device& PinnedPool::device() { return device_; }

ArenaStats PinnedPool::stats() const { return arena_->stats(); }

}  // namespace stp
