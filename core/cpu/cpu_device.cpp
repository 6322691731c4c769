#include "core/cpu/cpu_device.h"

#include <sys/mman.h>

#include <cstdlib>
#include <functional>

#include "core/cpu/cpu_stream.h"
#include "core/cpu/dry_stream.h"
#include "base/error.h"

namespace stp {

namespace {
// cudaMalloc's alignment, so that a GEMM operand at a given offset of an allocation has the same
// alignment here, in a dry run and on a GPU (core/gemm_shape.h); a multiple of the cache line.
constexpr std::size_t kAlignment = 256;

void* aligned_host_alloc(std::size_t bytes) {
  std::size_t padded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return std::aligned_alloc(kAlignment, padded == 0 ? kAlignment : padded);
}
}  // namespace

CpuDevice::CpuDevice(int index, CpuDeviceOptions options) : index_(index), options_(options) {
  device_.stats.capacity = options.capacity;
  pinned_.stats.capacity = std::numeric_limits<std::size_t>::max();
}

CpuDevice::~CpuDevice() {
  // Leaked buffers are a bug in the caller; free them so sanitizers point at the real owner.
  if (options_.dry_run) return;
  for (auto& [ptr, bytes] : device_.live) std::free(const_cast<char*>(ptr));
  for (auto& [ptr, bytes] : pinned_.live)
    if (!registered_.count(ptr)) std::free(const_cast<char*>(ptr));
}

std::string CpuDevice::name() const { return str("cpu:", index_); }

void* CpuDevice::allocate_in(Space& space, std::size_t bytes, const char* what, void* given) {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats& s = space.stats;
  if (bytes > s.capacity - s.in_use) {
    throw OutOfMemoryError(
        str(name(), ": out of ", what, " memory: requested ", format_bytes(bytes), ", in use ", format_bytes(s.in_use),
            ", capacity ", format_bytes(s.capacity), ", peak ", format_bytes(s.peak)),
        bytes);
  }
  void* ptr = given;
  if (given) {
    STP_ASSERT(!space.live.count(static_cast<const char*>(given)), name(), ": ", what, " memory registered twice");
    registered_.emplace(static_cast<const char*>(given), bytes);
  } else if (options_.dry_run) {
    ptr = reinterpret_cast<void*>(next_fake_);
    next_fake_ += (bytes + 2 * kAlignment - 1) / kAlignment * kAlignment;  // distinct even for 0 bytes
  } else {
    ptr = aligned_host_alloc(bytes);
  }
  if (!ptr) throw OutOfMemoryError(str(name(), ": host allocation of ", format_bytes(bytes), " failed"), bytes);
  space.live.emplace(static_cast<const char*>(ptr), bytes);
  s.in_use += bytes;
  if (s.in_use > s.peak) s.peak = s.in_use;
  ++s.alloc_count;
  return ptr;
}

std::size_t CpuDevice::release_in(Space& space, void* ptr, const char* what, bool owned) {
  if (!ptr) return 0;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = space.live.find(static_cast<const char*>(ptr));
    STP_ASSERT(it != space.live.end(), name(), ": free of a pointer that is not a live ", what, " allocation");
    const bool was_registered = registered_.count(static_cast<const char*>(ptr)) > 0;
    STP_ASSERT(was_registered != owned, name(), ": ", what, " memory ",
               owned ? "registered by the caller was freed by the device" : "unregistered but not registered");
    registered_.erase(static_cast<const char*>(ptr));
    bytes = it->second;
    space.stats.in_use -= bytes;
    ++space.stats.free_count;
    space.live.erase(it);
  }
  if (owned && !options_.dry_run) std::free(ptr);
  return bytes;
}

void* CpuDevice::allocate(std::size_t bytes) { return allocate_in(device_, bytes, "device"); }
void CpuDevice::deallocate(void* ptr) { release_in(device_, ptr, "device"); }

MemoryStats CpuDevice::memory_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_.stats;
}

void CpuDevice::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  device_.stats.peak = device_.stats.in_use;
  pinned_.stats.peak = pinned_.stats.in_use;
}

void* CpuDevice::allocate_pinned_host(std::size_t bytes) {
  void* ptr = allocate_in(pinned_, bytes, "pinned host");
  if (options_.lock_pinned && !options_.dry_run && bytes > 0 && mlock(ptr, bytes) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++lock_failures_;
  }
  return ptr;
}

void CpuDevice::deallocate_pinned_host(void* ptr) {
  if (options_.lock_pinned && !options_.dry_run && ptr) {
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pinned_.live.find(static_cast<const char*>(ptr));
      if (it != pinned_.live.end()) bytes = it->second;
    }
    if (bytes) munlock(ptr, bytes);
  }
  release_in(pinned_, ptr, "pinned host");
}

void CpuDevice::register_pinned_host(void* ptr, std::size_t bytes) {
  STP_ASSERT(ptr, "registering a null host pointer");
  allocate_in(pinned_, bytes, "pinned host", ptr);
  if (options_.lock_pinned && !options_.dry_run && bytes > 0 && mlock(ptr, bytes) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++lock_failures_;
  }
}

void CpuDevice::unregister_pinned_host(void* ptr) {
  std::size_t bytes = release_in(pinned_, ptr, "pinned host", false);
  if (options_.lock_pinned && !options_.dry_run && bytes) munlock(ptr, bytes);
}

MemoryStats CpuDevice::pinned_host_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_.stats;
}

bool CpuDevice::is_pinned_host(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto p = static_cast<const char*>(ptr);
  auto it = pinned_.live.upper_bound(p);  // first allocation starting after p
  if (it == pinned_.live.begin()) return false;
  --it;
  return std::less_equal<const char*>()(it->first, p) && std::less<const char*>()(p, it->first + it->second);
}

std::uint64_t CpuDevice::lock_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lock_failures_;
}

std::unique_ptr<Stream> CpuDevice::create_stream(std::string stream_name) {
  if (options_.dry_run) return std::make_unique<DryStream>(*this, std::move(stream_name));
  return std::make_unique<CpuStream>(*this, std::move(stream_name));
}

std::unique_ptr<Event> CpuDevice::create_event() { return std::make_unique<CpuEvent>(); }
std::unique_ptr<Event> CpuDevice::create_timing_event() { return std::make_unique<CpuEvent>(true); }

std::vector<std::unique_ptr<CpuDevice>> make_cpu_devices(int count, const CpuDeviceOptions& options, int first) {
  STP_CHECK(count >= 1, "need at least one CPU device, got ", count);
  std::vector<std::unique_ptr<CpuDevice>> devices;
  for (int i = first; i < first + count; ++i) devices.push_back(std::make_unique<CpuDevice>(i, options));
  return devices;
}

}  // namespace stp
