// PinnedPool (memory/pinned_pool.h) and the hwloc wrapper (memory/numa.h) on the CPU backend:
// the budget check before any pinning, exhaustion, no growth, NUMA placement, thread binding.
#include <gtest/gtest.h>
#include <hwloc.h>
#include <sched.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "base/error.h"
#include "memory/numa.h"
#include "memory/pinned_pool.h"

namespace {

using Block = std::shared_ptr<stp::Storage>;
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct PoolTest : ::testing::Test {
  stp::CpuDevice dev{0, {}};
  std::unique_ptr<stp::Stream> d2h = dev.create_stream("d2h");
};

TEST_F(PoolTest, PoolLargerThanTheHostBudgetIsRejectedBeforePinningAnything) {
  try {
    stp::PinnedPool pool(dev, *d2h, {.bytes = 2 * MiB, .host_budget = 1 * MiB});
    FAIL() << "a pool over memory.host_budget was built";
  } catch (const stp::OutOfMemoryError& e) {
    FAIL() << "a configuration error must not look like running out of memory: " << e.what();
  } catch (const stp::Error& e) {
    std::string m = e.what();
    EXPECT_TRUE(contains(m, "memory.host_budget")) << m;
    EXPECT_TRUE(contains(m, stp::format_bytes(2 * MiB))) << m;
    EXPECT_TRUE(contains(m, stp::format_bytes(1 * MiB))) << m;
  }
  auto pinned = dev.pinned_host_stats();
  EXPECT_EQ(pinned.in_use, 0u);
  EXPECT_EQ(pinned.alloc_count, 0u);
}

TEST_F(PoolTest, ServesAnyRequestUpToItsSizeThenThrowsOutOfMemory) {
  stp::PinnedPool pool(dev, *d2h, {.bytes = 1 * MiB, .host_budget = 4 * MiB});
  EXPECT_EQ(pool.capacity(), 1 * MiB);
  EXPECT_EQ(dev.pinned_host_stats().in_use, 1 * MiB);
  EXPECT_TRUE(dev.is_pinned_host(pool.allocate(1)->data));
  Block all = pool.allocate(1 * MiB);  // one segment: the whole pool is one block
  void* base = all->data;
  try {
    pool.allocate(1);
    FAIL() << "allocation from a full pool succeeded";
  } catch (const stp::OutOfMemoryError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.requested(), 1u);
    EXPECT_TRUE(contains(m, "out of pinned host memory")) << m;
    EXPECT_TRUE(contains(m, "memory.host_budget = " + stp::format_bytes(4 * MiB))) << m;
    EXPECT_TRUE(contains(m, "activations " + stp::format_bytes(1 * MiB))) << m;
    EXPECT_TRUE(contains(m, "Raise memory.host_budget")) << m;
  }
  EXPECT_THROW(pool.allocate(1 * MiB + 1), stp::OutOfMemoryError);
  all.reset();
  EXPECT_EQ(pool.allocate(1 * MiB)->data, base);
}

TEST_F(PoolTest, NeverGrowsOrPinsAgain) {
  const std::size_t before = dev.pinned_host_stats().alloc_count;
  {
    stp::PinnedPool pool(dev, *d2h, {.bytes = 4 * MiB, .host_budget = 8 * MiB, .chunk_bytes = 1 * MiB});
    std::vector<Block> live;
    for (int i = 0; i < 200; ++i) {
      live.push_back(pool.allocate((static_cast<std::size_t>(i) * 7919 % 700 + 1) * KiB));
      if (live.size() > 4) live.erase(live.begin());  // a sliding window of live buffers
    }
    live.clear();
    auto s = pool.stats();
    EXPECT_EQ(s.segment_allocs, 1u);
    EXPECT_EQ(s.segment_frees, 0u);
    EXPECT_EQ(s.reserved, 4 * MiB);
    EXPECT_EQ(s.peak_reserved, 4 * MiB);
    EXPECT_EQ(s.alloc_count, 200u);
    EXPECT_EQ(s.allocated, 0u);
    EXPECT_EQ(s.largest_free, 4 * MiB);  // everything coalesced back
    EXPECT_EQ(dev.pinned_host_stats().alloc_count, before + 1);
  }
  EXPECT_EQ(dev.pinned_host_stats().in_use, 0u);  // given back when the pool goes
}

TEST_F(PoolTest, CarvesFirstFitSoHighWaterIsTheSizeARunNeeds) {
  stp::PinnedPool pool(dev, *d2h, {.bytes = 1 * MiB, .host_budget = 1 * MiB});
  Block a = pool.allocate(256 * KiB), s1 = pool.allocate(4 * KiB);
  Block c = pool.allocate(64 * KiB), s2 = pool.allocate(4 * KiB);
  char* base = static_cast<char*>(a->data);
  a.reset();
  c.reset();
  // Holes: 256 KiB at the base, 64 KiB after s1, and the tail. Best fit would take the 64 KiB hole.
  Block small = pool.allocate(32 * KiB);
  EXPECT_EQ(small->data, base);
  EXPECT_EQ(pool.stats().high_water, (256 + 4 + 64 + 4) * KiB);  // s2's end: the furthest byte used
}

TEST_F(PoolTest, MemoryLivesOnTheNearestNumaNode) {
  const int nearest = stp::nearest_numa_node(dev);
  ASSERT_GE(stp::numa_node_count(), 1);
  ASSERT_GE(nearest, 0) << "this process may run on some CPU, so some node is nearest";
  ASSERT_LT(nearest, 1 << 16);
  // Several chunks, so the chunked bind + pre-fault loop runs more than once.
  stp::PinnedPool pool(dev, *d2h, {.bytes = 3 * MiB + 512, .host_budget = 8 * MiB, .chunk_bytes = 1 * MiB});
  Block all = pool.allocate(pool.capacity());
  const int where = stp::memory_node_of(all->data, pool.capacity());
  if (pool.numa_bound()) {
    EXPECT_EQ(pool.numa_node(), nearest);
  }
  if (pool.numa_node() >= 0 && where >= 0) {
    EXPECT_EQ(where, pool.numa_node());
  }
  if (stp::numa_node_count() == 1 && pool.numa_bound()) {
    EXPECT_EQ(pool.numa_node(), 0);
    EXPECT_EQ(where, 0);  // pre-faulted: every page is resident, and on node 0
  }
  if (!pool.numa_bound()) std::printf("note: NUMA binding is not supported here; pages placed by first touch\n");
}

// The pool maps, places and pre-faults its pages, then registers them with the device as
// pinned (cudaHostRegister on CUDA); the device counts them and copies treat them as pinned; the
// registration ends with the pool.
TEST_F(PoolTest, SegmentIsRegisteredAsPinnedAfterPlacementAndUnregisteredWithThePool) {
  void* base = nullptr;
  {
    stp::PinnedPool pool(dev, *d2h, {.bytes = 1 * MiB + 100, .host_budget = 4 * MiB});
    Block all = pool.allocate(pool.capacity());
    base = all->data;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % 4096, 0u) << "a fresh mapping is page-aligned";
    EXPECT_TRUE(dev.is_pinned_host(base));
    EXPECT_TRUE(dev.is_pinned_host(static_cast<char*>(base) + pool.capacity() - 1));
    auto pinned = dev.pinned_host_stats();
    EXPECT_EQ(pinned.in_use, pool.capacity());
    EXPECT_EQ(pinned.alloc_count, 1u);
    // Pre-faulted before pinning: if the kernel can say where the pages are, numa_node() says it.
    const int where = stp::memory_node_of(base, pool.capacity());
    if (where >= 0) {
      EXPECT_EQ(pool.numa_node(), where) << "numa_node() reports where the pages are, not the wish";
    }
  }
  EXPECT_FALSE(dev.is_pinned_host(base));
  EXPECT_EQ(dev.pinned_host_stats().in_use, 0u);
  EXPECT_EQ(dev.pinned_host_stats().free_count, 1u);
}

TEST(CpuDevicePinned, RegisteredMemoryIsCountedButNeverFreedByTheDevice) {
  std::vector<char> mine(64 * KiB);
  {
    stp::CpuDevice dev(0, {});
    dev.register_pinned_host(mine.data(), mine.size());
    EXPECT_TRUE(dev.is_pinned_host(mine.data() + 10));
    EXPECT_EQ(dev.pinned_host_stats().in_use, mine.size());
    EXPECT_THROW(dev.deallocate_pinned_host(mine.data()), stp::InternalError) << "the caller owns it";
    dev.unregister_pinned_host(mine.data());
    EXPECT_EQ(dev.pinned_host_stats().in_use, 0u);
    dev.register_pinned_host(mine.data(), mine.size());  // left registered: ~CpuDevice must not free it
  }
  mine[0] = 1;  // still ours (ASan would report a double free otherwise)
  SUCCEED();
}

TEST_F(PoolTest, LockedPagesAreBoundAndStayLocked) {
  stp::CpuDeviceOptions o;
  o.lock_pinned = true;  // registration mlock()s the pages: after binding and pre-faulting, as cudaHostRegister would
  stp::CpuDevice locked(1, o);
  auto s = locked.create_stream("d2h");
  stp::PinnedPool pool(locked, *s, {.bytes = 1 * MiB, .host_budget = 1 * MiB});
  const int where = stp::memory_node_of(pool.allocate(1 * MiB)->data, 1 * MiB);
  if (pool.numa_node() >= 0 && where >= 0) {
    EXPECT_EQ(where, pool.numa_node());
  }
  EXPECT_EQ(locked.pinned_host_stats().alloc_count, 1u);
  if (locked.lock_failures() != 0) std::printf("note: mlock refused here (RLIMIT_MEMLOCK)\n");
}

// A device that knows its NUMA node (a GPU's PCI locality; emulated here) gets that node,
// and with it the pinned pool's pages; an unknown or non-existent node falls back.
TEST(Numa, TheDevicesOwnNodeWinsWhenItExists) {
  stp::CpuDevice plain(0, {});
  const int fallback = stp::nearest_numa_node(plain);
  ASSERT_GE(fallback, 0);
  stp::CpuDevice located(0, {.numa_node = fallback});
  EXPECT_EQ(stp::nearest_numa_node(located), fallback);
  stp::CpuDevice nowhere(0, {.numa_node = 4095});  // no such node here
  EXPECT_EQ(stp::nearest_numa_node(nowhere), fallback);
  if (stp::numa_node_count() > 1) {
    stp::CpuDevice second(0, {.numa_node = 1});
    EXPECT_EQ(stp::nearest_numa_node(second), 1) << "the device's node, not the round-robin answer";
  }
}

TEST(Numa, BindMemoryAndQueryItsNode) {
  stp::CpuDevice dev(0, {});
  const int node = stp::nearest_numa_node(dev);
  const std::size_t bytes = 256 * KiB;
  std::vector<char> buf(bytes);
  const bool bound = stp::bind_memory(buf.data(), bytes, node);
  const int where = stp::memory_node_of(buf.data(), bytes);
  if (bound && where >= 0) {
    EXPECT_EQ(where, node);
  }
  EXPECT_FALSE(stp::bind_memory(buf.data(), bytes, -1));  // unknown node: nothing to do
  EXPECT_EQ(stp::memory_node_of(buf.data(), 0), -1);
  try {
    stp::bind_memory(buf.data(), bytes, 1 << 20);
    FAIL() << "binding to a node that does not exist succeeded";
  } catch (const stp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "NUMA node 1048576 does not exist")) << e.what();
  }
}

TEST(Numa, CopyStreamThreadIsBoundNearTheNode) {
  stp::CpuDevice dev(0, {});
  auto copy = dev.create_stream("d2h");
  const int node = stp::nearest_numa_node(dev);
  ASSERT_GE(node, 0);
  hwloc_topology_t topo;  // the test's own view, to check the binding independently
  ASSERT_EQ(hwloc_topology_init(&topo), 0);
  ASSERT_EQ(hwloc_topology_load(topo), 0);
  hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(node));
  ASSERT_NE(obj, nullptr);
  // First pin the worker to a single CPU, so that a binding to the node's CPUs is observable even
  // on a one-node machine, where the node's CPUs are all the CPUs.
  hwloc_bitmap_t one = hwloc_bitmap_dup(obj->cpuset);
  hwloc_bitmap_singlify(one);
  bool narrowed = false, queried = false, equal = false;
  copy->enqueue_host([&] { narrowed = hwloc_set_cpubind(topo, one, HWLOC_CPUBIND_THREAD) == 0; });
  stp::bind_stream_threads_near(*copy, node);
  copy->enqueue_host([&] {
    hwloc_bitmap_t now = hwloc_bitmap_alloc();
    queried = hwloc_get_cpubind(topo, now, HWLOC_CPUBIND_THREAD) == 0;
    equal = queried && hwloc_bitmap_isequal(now, obj->cpuset);
    hwloc_bitmap_free(now);
  });
  EXPECT_NO_THROW(copy->synchronize());  // the binding task itself did not fail
  const bool observable = narrowed && queried && hwloc_bitmap_weight(obj->cpuset) > 1;
  if (observable) {
    EXPECT_TRUE(equal) << "the copy thread is not bound to NUMA node " << node << "'s CPUs";
  }
  if (!observable) std::printf("note: thread binding cannot be observed here\n");
  EXPECT_NO_THROW(stp::bind_stream_threads_near(*copy, -1));  // unknown node: left alone
  copy->synchronize();
  hwloc_bitmap_free(one);
  hwloc_topology_destroy(topo);
}

// memory.copy_engine_cpus: the split covers the process's CPUs exactly, the copy CPUs are the last
// ones, and a stream bound to them runs there; asking for every CPU is a clear error.
TEST(CopyEngineCpus, SplitsTheProcessCpusAndBindsCopyThreads) {
  std::vector<int> all = stp::allowed_cpus();
  ASSERT_FALSE(all.empty());
  try {
    stp::split_cpus_for_copies(static_cast<int>(all.size()));
    FAIL() << "reserving every CPU for copies was accepted";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.copy_engine_cpus"), std::string::npos) << e.what();
  }
  if (all.size() < 2) GTEST_SKIP() << "one CPU: nothing to split";
  stp::CpuSplit split = stp::split_cpus_for_copies(1);
  EXPECT_EQ(split.copy, std::vector<int>{all.back()});
  std::vector<int> joined = split.compute;
  joined.insert(joined.end(), split.copy.begin(), split.copy.end());
  EXPECT_EQ(joined, all);

  bool permitted = false;  // a sandbox may forbid affinity changes (then bindings are skipped)
  std::thread([&] { permitted = stp::bind_current_thread_to_cpus(split.copy); }).join();
  if (!permitted) GTEST_SKIP() << "this sandbox does not allow binding threads to CPUs";
  stp::CpuDevice dev(0, {});
  auto copy = dev.create_stream("d2h");
  stp::bind_stream_threads_to_cpus(*copy, split.copy);
  std::vector<int> seen;  // written on the stream's worker, read after synchronize()
  copy->enqueue_host([&seen] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) seen.push_back(c);
  });
  copy->synchronize();
  EXPECT_EQ(seen, split.copy) << "the copy stream's thread does not run on the copy-engine CPU";
}

}  // namespace
