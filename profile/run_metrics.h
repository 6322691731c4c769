// What a run's metrics.jsonl (docs/design.md, Files) says that the profile report sets next to the trace:
// the peaks reported at the last logged step (the allocators' peaks since the start, so the
// largest of the run) and the wall step times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stp::profile {

struct RunMetrics {
  std::int64_t steps = 0;  // lines read
  std::int64_t last_step = 0;
  std::vector<double> peak_device_bytes;  // per device, at the last line
  double peak_host_pinned_bytes = 0;      // at the last line
  std::vector<double> step_ms;            // per line, in file order
  int cut_line = 0;                       // the number of a cut last line, left out (profile/metrics_lines.h); 0 = none
};

// Reads the file as profile/metrics_lines.h says. Throws stp::Error naming the file and line on a
// missing file, malformed JSON or missing keys.
RunMetrics read_run_metrics(const std::string& path);

}  // namespace stp::profile
