#include "tools/bench/bench_memory/step_runs.h"

#include <algorithm>
#include <vector>

#include <sys/resource.h>

#include "tools/bench/bench_memory/common.h"

namespace stp::bench_memory {

namespace {

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Whether the last step's streamed bytes of every device equal its plan's per-step bytes.
bool stream_bytes_match(const stp::StepResult& r, const stp::MemoryPlan& plan, StepTimes& out) {
  bool equal = r.param_stream.size() == plan.predicted.size();
  for (std::size_t g = 0; equal && g < r.param_stream.size(); ++g) {
    const stp::RankPrediction& p = plan.predicted[g];
    const stp::ParamStreamCounters& s = r.param_stream[g];
    equal =
        s.h2d_bytes == p.stream_weights_up_bytes + p.stream_grads_up_bytes && s.d2h_bytes == p.stream_grads_down_bytes;
    out.stream_bytes = std::max<std::uint64_t>(out.stream_bytes, s.h2d_bytes + s.d2h_bytes);
    out.stream_copies = std::max<std::uint64_t>(out.stream_copies, s.h2d_copies + s.d2h_copies);
  }
  return equal;
}

}  // namespace

StepTimes run_steps(const stp::Config& c, int steps, stp::StepResult::Speculation* speculation) {
  stp::Trainer t(c);
  t.step();  // warm-up: first-touch of memory, caches
  std::vector<double> ms, stall, copy;
  StepTimes out;
  const double cpu_before = process_cpu_s();
  for (int i = 0; i < steps; ++i) {
    stp::StepResult r = t.step();
    if (i + 1 == steps) {
      const stp::MemoryPlan& plan = t.memory_plan();
      out.peaks_equal = r.peak_device_bytes.size() == plan.predicted.size();
      for (std::size_t g = 0; out.peaks_equal && g < plan.predicted.size(); ++g)
        out.peaks_equal = r.peak_device_bytes[g] == plan.predicted[g].peak_device_bytes;
      out.stream_bytes_equal = stream_bytes_match(r, plan, out);
    }
    if (speculation) {
      speculation->committed += r.speculation.committed;
      speculation->discarded += r.speculation.discarded;
      speculation->hidden_s += r.speculation.hidden_s;
    }
    ms.push_back(r.step_ms);
    double s = 0, cp = 0;
    for (const auto& o : r.offload) s = std::max(s, o.stall_s), cp = std::max(cp, o.d2h_busy_s + o.h2d_busy_s);
    stall.push_back(s * 1e3), copy.push_back(cp * 1e3);
  }
  out.step_ms = median(ms), out.stall_ms = median(stall), out.copy_ms = median(copy);
  out.cpu_ms = (process_cpu_s() - cpu_before) * 1e3 / std::max(1, steps);
  return out;
}

}  // namespace stp::bench_memory
