#include "memory/numa.h"

#include <hwloc.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "base/error.h"

namespace stp {

namespace {

// Loaded once; hwloc allows concurrent read-only queries and binding calls on a loaded topology.
class Topology {
 public:
  Topology() {
    STP_CHECK(hwloc_topology_init(&topo_) == 0, "hwloc: cannot initialise the topology: ", errno_message(errno));
    if (hwloc_topology_load(topo_) != 0) {
      int err = errno;
      hwloc_topology_destroy(topo_);
      throw Error(str("hwloc: cannot load the machine topology: ", errno_message(err)));
    }
  }
  ~Topology() { hwloc_topology_destroy(topo_); }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  hwloc_topology_t get() const { return topo_; }

  static std::string errno_message(int err) { return std::system_category().message(err); }

 private:
  hwloc_topology_t topo_ = nullptr;
};

hwloc_topology_t topology() {
  static Topology t;  // C++ guarantees one thread-safe initialisation
  return t.get();
}

// RAII for hwloc bitmaps (cpusets and nodesets).
struct Bitmap {
  Bitmap() : b(hwloc_bitmap_alloc()) { STP_ASSERT(b, "hwloc_bitmap_alloc failed"); }
  ~Bitmap() { hwloc_bitmap_free(b); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  hwloc_bitmap_t b;
};

// ENOSYS: no NUMA policy syscalls; EXDEV: cannot be enforced; EPERM: forbidden by a sandbox
// (containers without CAP_SYS_NICE get EPERM from mbind/move_pages). None is the caller's bug,
// and placement then stays the OS's first-touch default, which is what runs without stp anyway.
bool unsupported(int err) { return err == ENOSYS || err == EXDEV || err == EPERM; }

hwloc_obj_t numa_object(int node) {
  hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(topology(), static_cast<unsigned>(node));
  STP_CHECK(obj, "NUMA node ", node, " does not exist on this machine (", numa_node_count(), " node(s))");
  return obj;
}

}  // namespace

int numa_node_count() {
  int n = hwloc_get_nbobjs_by_type(topology(), HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

int nearest_numa_node(const Device& device) {
  hwloc_topology_t topo = topology();
  const int hint = device.numa_node_hint();
  if (hint >= 0 && hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(hint))) return hint;
  // The CPUs this process may run on: its binding (taskset, numactl) within the allowed set
  // (cgroups). Either query may be unsupported; then the allowed set alone decides.
  Bitmap cpus;
  hwloc_bitmap_copy(cpus.b, hwloc_topology_get_allowed_cpuset(topo));
  {
    Bitmap bound;
    if (hwloc_get_cpubind(topo, bound.b, HWLOC_CPUBIND_PROCESS) == 0 && hwloc_bitmap_intersects(bound.b, cpus.b))
      hwloc_bitmap_and(cpus.b, cpus.b, bound.b);
  }
  Bitmap nodes;
  hwloc_cpuset_to_nodeset(topo, cpus.b, nodes.b);
  std::vector<int> candidates;
  for (int i = hwloc_bitmap_first(nodes.b); i >= 0; i = hwloc_bitmap_next(nodes.b, i)) candidates.push_back(i);
  if (candidates.empty()) return -1;
  return candidates[static_cast<std::size_t>(device.index()) % candidates.size()];
}

bool bind_memory(void* p, std::size_t bytes, int node) {
  if (node < 0 || bytes == 0) return false;
  hwloc_obj_t obj = numa_object(node);
  int rc = hwloc_set_area_membind(topology(), p, bytes, obj->nodeset, HWLOC_MEMBIND_BIND,
                                  HWLOC_MEMBIND_MIGRATE | HWLOC_MEMBIND_BYNODESET);
  if (rc == 0) return true;
  int err = errno;
  if (unsupported(err)) return false;
  throw Error(str("cannot bind ", format_bytes(bytes), " of host memory to NUMA node ", node, ": ",
                  Topology::errno_message(err)));
}

int memory_node_of(const void* p, std::size_t bytes) {
  if (bytes == 0) return -1;
  Bitmap nodes;
  if (hwloc_get_area_memlocation(topology(), p, bytes, nodes.b, HWLOC_MEMBIND_BYNODESET) != 0) return -1;
  if (hwloc_bitmap_weight(nodes.b) != 1) return -1;  // none resident, or spread over several
  return hwloc_bitmap_first(nodes.b);
}

bool bind_current_thread_near(int node) {
  if (node < 0) return false;
  hwloc_obj_t obj = numa_object(node);
  // A memory-only node (CXL, HBM) has no CPUs to run on: leave the thread where it is.
  if (!obj->cpuset || hwloc_bitmap_iszero(obj->cpuset)) return false;
  if (hwloc_set_cpubind(topology(), obj->cpuset, HWLOC_CPUBIND_THREAD) == 0) return true;
  int err = errno;
  if (unsupported(err)) return false;
  throw Error(str("cannot bind a thread to the CPUs of NUMA node ", node, ": ", Topology::errno_message(err)));
}

void bind_stream_threads_near(Stream& stream, int node) {
  if (stream.device().kind() != DeviceKind::Cpu || node < 0) return;
  stream.enqueue_host([node] { bind_current_thread_near(node); });
}

std::vector<int> allowed_cpus() {
  static const std::vector<int> cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    STP_CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity failed: ", std::strerror(errno));
    std::vector<int> out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }();
  return cpus;
}

CpuSplit split_cpus_for_copies(int copy_cpus) {
  std::vector<int> cpus = allowed_cpus();
  STP_CHECK(copy_cpus >= 0 && copy_cpus < static_cast<int>(cpus.size()), "memory.copy_engine_cpus = ", copy_cpus,
            " leaves no CPU for compute: this process may run on ", cpus.size(), " CPU(s); use at most ",
            cpus.size() - 1, ", or 0 to share every CPU");
  CpuSplit split;
  split.copy.assign(cpus.end() - copy_cpus, cpus.end());
  split.compute.assign(cpus.begin(), cpus.end() - copy_cpus);
  return split;
}

bool bind_current_thread_to_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) == 0) return true;
  int err = errno;
  if (unsupported(err)) return false;
  throw Error(str("cannot bind a thread to CPUs ", cpus.size(), ": ", std::strerror(err)));
}

void bind_stream_threads_to_cpus(Stream& stream, std::vector<int> cpus) {
  if (stream.device().kind() != DeviceKind::Cpu || cpus.empty()) return;
  stream.enqueue_host([cpus = std::move(cpus)] { bind_current_thread_to_cpus(cpus); });
}

}  // namespace stp
