// Trace recorder: spans per (rank, stream) exported as Chrome Trace Event Format JSON
// (complete "X" events; pid = rank, tid = stream name), loadable in Perfetto.
// Thread-safe. Streams record into it only when attached (Stream::set_trace); when no recorder
// is attached, tracing costs one pointer test per trace_begin/trace_end call.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace stp {

struct TraceSpan {
  int pid = 0;              // rank
  std::string tid;          // stream: compute, tp-comm, p2p, d2h, h2d
  std::string name;         // e.g. "F0.3", "AR", "offload"
  std::string category;     // e.g. "F", "B", "W", "comm", "copy"
  std::string args_json;    // a JSON object ("{...}") or empty
  double ts_us = 0;         // start, microseconds since the recorder was created
  double dur_us = 0;
};

class TraceRecorder {
 public:
  TraceRecorder();
  double now_us() const;  // monotonic clock, relative to construction
  void add(TraceSpan span);
  std::vector<TraceSpan> spans() const;
  std::string to_json() const;
  void write(const std::string& path) const;  // throws stp::Error if the file cannot be written

 private:
  double origin_us_;
  mutable std::mutex mu_;
  std::vector<TraceSpan> spans_;
};

std::string json_escape(const std::string& s);

}  // namespace stp
