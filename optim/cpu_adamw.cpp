#include "optim/cpu_adamw.h"

#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "memory/numa.h"

namespace stp {

void cpu_adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWScalars& c, CpuIsa isa,
                      bool parallel) {
  STP_CHECK(cpu_has_isa(isa), "cpu_adamw_update: ", to_string(isa),
            " is not allowed here: this CPU and STP_CPU_ISA allow ", to_string(best_cpu_isa()), " at most");
  if (n == 0) return;
  if (!parallel) return adamw_range(isa, p, g, m, v, 0, n, c);
  for_cpu_blocks(n, [&](std::size_t begin, std::size_t end) { adamw_range(isa, p, g, m, v, begin, end, c); });
}

void cpu_adamw_update_copy(float* p, const float* p_from, const float* g, float* m, const float* m_from, float* v,
                           const float* v_from, std::size_t n, const AdamWScalars& c) {
  const CpuIsa isa = best_cpu_isa();
  for_cpu_blocks(n, [&](std::size_t begin, std::size_t end) {
    const std::size_t bytes = (end - begin) * sizeof(float);
    std::memcpy(m + begin, m_from + begin, bytes);
    std::memcpy(v + begin, v_from + begin, bytes);
    if (p_from) std::memcpy(p + begin, p_from + begin, bytes);
    adamw_range(isa, p, g, m, v, begin, end, c);
  });
}

void for_cpu_blocks(std::size_t n, const std::function<void(std::size_t begin, std::size_t end)>& fn) {
  if (n <= kCpuAdamWGrain) return fn(0, n);
#if defined(STP_TSAN)
  // Debian's libtbb is not instrumented: ThreadSanitizer cannot see the synchronization inside it
  // and reports every hand-off of a block to a worker as a race. Under it the same blocks run in
  // order on the calling thread, so what it checks is ours: several ranks' updates at once.
  for (std::size_t begin = 0; begin < n; begin += kCpuAdamWGrain) fn(begin, std::min(n, begin + kCpuAdamWGrain));
#else
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n, kCpuAdamWGrain),
      [&](const tbb::blocked_range<std::size_t>& r) { fn(r.begin(), r.end()); }, tbb::simple_partitioner());
#endif
}

CpuAdamWState::CpuAdamWState(const std::vector<std::size_t>& sizes, int node) : sizes_(sizes) {
  // Each moment starts on a 64-byte boundary (one cache line, one AVX-512 vector).
  auto padded = [](std::size_t n) { return (n + 15) / 16 * 16; };
  std::size_t floats = 0;
  for (std::size_t n : sizes_) floats += 2 * padded(n);
  bytes_ = std::max<std::size_t>(floats * sizeof(float), 1);
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STP_CHECK(base_ != MAP_FAILED, "CpuAdamWState: cannot map ", bytes_, " bytes of host memory: ", std::strerror(errno));
  // Bound before the first touch, so the zero pages are allocated on the node.
  bound_ = node >= 0 && bind_memory(base_, bytes_, node);
  auto* at = static_cast<float*>(base_);
  for (std::size_t n : sizes_) {
    m_.push_back(at);
    at += padded(n);
    v_.push_back(at);
    at += padded(n);
  }
  // Touch every page now (in parallel, as the updates will), not in the first step.
  // for_cpu_blocks, not a bare parallel_for: under ThreadSanitizer the blocks must run on this
  // thread, or the readers of the zeroed state race with oneTBB workers TSan cannot see join.
  auto* all = static_cast<float*>(base_);
  for_cpu_blocks(floats, [all](std::size_t begin, std::size_t end) {
    std::memset(all + begin, 0, (end - begin) * sizeof(float));
  });
}

CpuAdamWState::~CpuAdamWState() {
  if (base_ && base_ != MAP_FAILED) munmap(base_, bytes_);
}

}  // namespace stp
