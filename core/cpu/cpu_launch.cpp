#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/cpu/cpu_stream.h"
#include "core/cpu/dry_stream.h"
#include "core/launch.h"

namespace stp {

void cpu_parallel_for(Stream& stream, std::size_t n, std::size_t grain,
                      std::function<void(std::size_t, std::size_t)> body) {
  if (is_dry(stream)) return;
  CpuStream& s = as_cpu_stream(stream);
  grain = grain == 0 ? 1 : grain;
  s.enqueue(
      [n, grain, body = std::move(body)] {
#if defined(STP_TSAN)
        // oneTBB's scheduler lives in an uninstrumented shared library, so ThreadSanitizer
        // reports false races inside parallel_for's own task tree. TSan builds therefore run
        // kernel bodies serially on the stream thread: the concurrency under test there is
        // the runtime's (streams, events, communicators), not TBB's index splitting.
        body(0, n);
        return;
#endif
        if (n <= grain) {  // small kernels: no scheduling overhead
          body(0, n);
          return;
        }
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                          [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
      },
      false);
}

}  // namespace stp
