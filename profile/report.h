// The `stp profile` report: what overlap.h, memory.h and predict.h found, for people (text) and
// for scripts (JSON, docs/design.md, Files). Times are per step (means over the steps analysed).
//
// JSON: {"steps":[…analysed…],
//        "ranks":[{"rank","steps","step_ms","span_ms","busy_ms","compute_busy_fraction","pp_bubble_ms",
//                  "p2p_wait_ms","copy_stall_ms","issue_gap_ms","tp_comm_ms","tp_exposed_ms","p2p_ms",
//                  "p2p_exposed_ms","d2h_bytes","h2d_bytes","d2h_gbps","h2d_gbps","copy_hidden_fraction",
//                  "peak_device_bytes","peak_pinned_bytes","streams":{lane: busy ms},
//                  "high_water":[{"step","time_ms","bytes","op","by_category":{…}}]}],
//        "total":{same time and byte fields, summed over ranks; peak_device_bytes = max},
//        "metrics":{"peak_device_bytes":[…],"peak_host_pinned_bytes","step_ms"}            (if read)
//        "predicted":{"schedule","pp","tp","microbatches","costs":{"tf","tb","tw","tar","tp2p","units"},
//                     "sim_flags","d2h_gbps","h2d_gbps","makespan_ms":{"measured","predicted"},
//                     "ranks":[{"rank","span_ms":{…},"busy_ms":{…},"tp_exposed_ms":{…},"pp_bubble_ms":{…}}],
//                     "peak_device_bytes":[{"rank","measured","predicted"}]}                 (if possible)
//        "notes":[…why a part is missing…]}
// (bytes and byte rates are per step too; peaks are over the whole trace.)
#pragma once

#include <string>
#include <vector>

#include "profile/memory.h"
#include "profile/overlap.h"
#include "profile/predict.h"
#include "profile/run_metrics.h"
#include "profile/timeline.h"

namespace stp::profile {

struct Report {
  std::string run;                  // what is profiled (the run folder)
  std::vector<std::int64_t> steps;  // step numbers analysed
  std::int64_t steps_in_trace = 0;
  std::vector<RankTimes> ranks;      // per global rank
  std::vector<MemoryReport> memory;  // per global rank
  bool has_metrics = false;
  RunMetrics metrics;
  bool has_prediction = false;
  std::string schedule;
  int pp = 0, tp = 0, microbatches = 0;
  Prediction prediction;
  std::vector<double> planned_peak_device;  // per global rank, from the memory planner (empty: none)
  std::vector<std::string> notes;
};

// The measured part (ranks, memory, steps); the caller adds metrics and the prediction.
Report measure_run(const Trace& trace, const std::vector<RankTimeline>& ranks, const StepFilter& filter);

std::string render_text(const Report& r);
std::string render_json(const Report& r);

}  // namespace stp::profile
