// Trace recorder: spans per (rank, stream) and counters per rank, exported as Chrome Trace Event
// Format JSON (loadable in Perfetto and chrome://tracing; `stp profile` reads it back).
//
// Exported events (docs/design.md, Files), all with "ph", "pid" (the rank) and "tid":
//   "M"  metadata: process_name "rank N" and thread_name per stream (tid 0 for the process);
//   "X"  complete spans: "name", "cat", "ts", "dur" (µs) and "args" (an object); the stream is a
//        numeric tid named by its thread_name event: the five known streams of base/trace_names.h
//        1..5 (compute, tp-comm, p2p, d2h, h2d), other streams 6, 7, … in order of first appearance;
//   "C"  counters: "name" (a track of base/trace_names.h), "ts" (µs) and "args" {series: number, …}.
// Every stream, category, track, series and argument name is defined once, in base/trace_names.h.
// Thread-safe. Streams record into it only when attached (Stream::set_trace); when no recorder
// is attached, tracing costs one pointer test per trace_begin/trace_end call.
#pragma once

#include <concepts>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace stp {

// The arguments of a span ("args"): typed key-value pairs, exported as one JSON object in the order
// they were added. A value is an integer (printed exactly), a bool or a string (escaped by
// json_escape); a key is a name of trace::arg (base/trace_names.h). Built by chaining add():
//   TraceArgs().add(trace::arg::kBytes, bytes).add(trace::arg::kChunk, chunk)
// Any other value type does not compile. Each add() writes its member's JSON at once: a span keeps
// its arguments as one short string, as small as the JSON it exports (a trace holds about a
// million spans, all kept until it is written).
class TraceArgs {
 public:
  template <class T>
  TraceArgs& add(std::string_view key, T&& value) & {
    using U = std::remove_cvref_t<T>;
    begin_member(key);
    if constexpr (std::same_as<U, bool>) append_bool(value);
    else if constexpr (std::integral<U> && std::is_signed_v<U>) append_int(static_cast<std::int64_t>(value));
    else if constexpr (std::integral<U>) append_uint(static_cast<std::uint64_t>(value));
    else if constexpr (std::is_convertible_v<const U&, std::string_view>) append_string(std::string_view(value));
    else static_assert(sizeof(U) == 0, "a trace argument is an integer, a bool or a string");
    return *this;
  }
  template <class T>
  TraceArgs&& add(std::string_view key, T&& value) && {
    add(key, std::forward<T>(value));
    return std::move(*this);
  }
  bool empty() const { return json_.size() == 2; }
  const std::string& json() const { return json_; }  // the object, "{}" when empty

 private:
  void begin_member(std::string_view key);  // `,"key":` (no comma first) before the closing brace
  void append_bool(bool v);
  void append_int(std::int64_t v);
  void append_uint(std::uint64_t v);
  void append_string(std::string_view v);

  std::string json_ = "{}";
};

struct TraceSpan {
  int pid = 0;           // rank
  std::string tid;       // stream (trace::stream)
  std::string name;      // e.g. "F0.3 h.1.mlp", "AR F0.3 h.1.mlp", "offload 0.3 u1"
  std::string category;  // trace::cat: "F", "B", "W", "op", the stream's name for copies and comm, …
  TraceArgs args;
  double ts_us = 0;  // start, microseconds since the recorder was created
  double dur_us = 0;
};

// One sample of a counter track: from ts_us on, each series has its value (until the next sample).
struct TraceCounter {
  int pid = 0;                                         // rank
  std::string name;                                    // track (trace::track)
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

// The numeric tid a stream name is exported under (1..5 for the five known streams of
// base/trace_names.h, 0 otherwise).
int known_stream_tid(const std::string& stream);

// The contents of a JSON string literal for `s` (no quotes): quote, backslash and control characters
// escaped as nlohmann-json escapes them (\n, \t, \b, \f, \r, else \u00XX); UTF-8 passes through.
std::string json_escape(std::string_view s);

}  // namespace stp
