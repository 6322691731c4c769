// Trace recorder: spans per (rank, stream) and counters per rank, exported as Chrome Trace Event
// Format JSON (loadable in Perfetto and chrome://tracing; `stp profile` reads it back).
//
// Exported events (docs/design.md, Files), all with "ph", "pid" (the rank) and "tid":
//   "M"  metadata: process_name "rank N" and thread_name per stream (tid 0 for the process);
//   "X"  complete spans: "name", "cat", "ts", "dur" (µs) and "args" (an object); the stream is a
//        numeric tid named by its thread_name event: compute 1, tp-comm 2, p2p 3, d2h 4, h2d 5,
//        other streams 6, 7, … in order of first appearance;
//   "C"  counters: "name" (e.g. "device memory"), "ts" (µs) and "args" {series: number, …}.
// Thread-safe. Streams record into it only when attached (Stream::set_trace); when no recorder
// is attached, tracing costs one pointer test per trace_begin/trace_end call.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace stp {

struct TraceSpan {
  int pid = 0;            // rank
  std::string tid;        // stream: compute, tp-comm, p2p, d2h, h2d
  std::string name;       // e.g. "F0.3", "AR", "offload"
  std::string category;   // e.g. "F", "B", "W", "comm", "copy"
  std::string args_json;  // a JSON object ("{...}") or empty
  double ts_us = 0;       // start, microseconds since the recorder was created
  double dur_us = 0;
};

// One sample of a counter track: from ts_us on, each series has its value (until the next sample).
struct TraceCounter {
  int pid = 0;                                         // rank
  std::string name;                                    // track, e.g. "device memory"
  double ts_us = 0;                                    // microseconds since the recorder was created
  std::vector<std::pair<std::string, double>> series;  // e.g. {"activations", 1.5e6}
};

class TraceRecorder {
 public:
  TraceRecorder();
  double now_us() const;  // monotonic clock, relative to construction
  void add(TraceSpan span);
  void add_counter(TraceCounter counter);
  std::vector<TraceSpan> spans() const;
  std::vector<TraceCounter> counters() const;
  std::string to_json() const;
  void write(const std::string& path) const;  // throws stp::Error if the file cannot be written

 private:
  double origin_us_;
  mutable std::mutex mu_;
  std::vector<TraceSpan> spans_;
  std::vector<TraceCounter> counters_;
};

// The numeric tid a stream name is exported under (1..5 for the five known streams, 0 otherwise).
int known_stream_tid(const std::string& stream);

// The contents of a JSON string literal for `s` (no quotes): quote, backslash and control characters
// escaped as nlohmann-json escapes them (\n, \t, \b, \f, \r, else \u00XX); UTF-8 passes through.
std::string json_escape(const std::string& s);

}  // namespace stp
