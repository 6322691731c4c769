#include "memory/pinned_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/cpu/dry_stream.h"
#include "base/error.h"
#include "memory/numa.h"

namespace stp {

namespace {

constexpr std::size_t kBlockAlign = 256;  // BlockArena's block alignment: the segment is rounded to it

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

std::size_t page_size() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Writes one byte per page, so the kernel allocates every page now — on the node the range is
// bound to — instead of on first use by a copy (a reading touch would only map the zero page).
void prefault(char* p, std::size_t bytes) {
  volatile char* q = p;
  for (std::size_t off = 0; off < bytes; off += page_size()) q[off] = 0;
  if (bytes) q[bytes - 1] = 0;  // the last page when p is not page-aligned
}

// Where the segment ended up; filled by the arena's `take`, which runs inside the constructor.
struct Placement {
  int node = -1;
  bool bound = false;
  std::size_t mapped = 0;  // bytes of the mapping (a whole number of pages)
};

}  // namespace

PinnedPool::PinnedPool(Device& device, Stream& home, PinnedPoolOptions options) : device_(device) {
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
  // run with a generous pool is exactly the pool that run needs (block_arena.h, BlockPlacement).
  a.placement = BlockPlacement::FirstFit;
  a.advice = "Raise memory.host_budget.";
  // The arena's state may outlive this object (storages keep it), so the backend captures values
  // only. `take` runs once, from reserve() below.
  //
  // Order (docs/gpu-readiness.md, Memory): map fresh pages, bind the range to the node, pre-fault it
  // (the kernel allocates each page on the bound node), and only then pin it
  // (Device::register_pinned_host; CUDA: cudaHostRegister). Pinned pages do not migrate, so binding
  // after cudaHostAlloc (the former order) left them wherever the allocating thread's first touch
  // put them while mbind still reported success.
  a.take = [&device, nearest, chunk = options.chunk_bytes, placement](std::size_t bytes) -> void* {
    if (is_dry(device)) return device.allocate_pinned_host(bytes);  // no memory behind it: nothing to place
    const std::size_t mapped = round_up(std::max<std::size_t>(bytes, 1), page_size());
    void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw OutOfMemoryError(str("cannot map ", format_bytes(mapped), " of host memory for the pinned host pool: ",
                                 std::strerror(errno), ". Lower memory.host_budget or offload fewer activations."),
                             bytes);
    char* p = static_cast<char*>(m);
    try {
      // Bind before touching: untouched pages are then allocated on the node directly. Chunks bound
      // each system call and page-walk.
      bool bound = nearest >= 0;
      const std::size_t step = round_up(chunk, page_size());  // mbind takes page-aligned ranges
      for (std::size_t off = 0; off < mapped; off += step) {
        std::size_t len = std::min(step, mapped - off);
        if (bound) bound = bind_memory(p + off, len, nearest);
        prefault(p + off, len);
      }
      placement->bound = bound;
      // Where the pages are, as the kernel reports it. If it cannot tell (the query is not
      // supported), a successful bind before the first touch is where they are.
      const int measured = memory_node_of(p, mapped);
      placement->node = measured >= 0 ? measured : bound ? nearest : -1;
      device.register_pinned_host(p, bytes);
    } catch (...) {
      munmap(p, mapped);
      throw;
    }
    placement->mapped = mapped;
    return p;
  };
  a.give = [&device, placement](void* p) {
    if (is_dry(device)) return device.deallocate_pinned_host(p);
    device.unregister_pinned_host(p);
    munmap(p, placement->mapped);
  };
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
