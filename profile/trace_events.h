// The events `stp profile` works on: a Chrome Trace Event Format trace (base/trace.h) read into
// flat arrays, with names interned, so a million-event trace fits in memory and scans fast.
//
//   Span     one "X" event: rank (pid), lane (the stream, from its thread_name metadata or a string
//            tid), kind (compute spans by "cat": F, B, W unit; op; step), times in µs, and the
//            args `stp train` writes: part ("F0.3"), bytes (copies, all-reduces), chunk and mb.
//   Counter  one "C" sample: rank, track name (the device and pinned memory tracks), time, and its
//            series (name id, value) in Trace::values[begin, end).
// The stream, category, track and argument names are base/trace_names.h's.
//
// Lanes are the five streams of a training rank: compute, tp-comm, p2p, d2h, h2d; any other
// stream is Lane::Other (kept, ignored by the analysis).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace stp::profile {

enum class Lane : std::uint8_t { Compute, TpComm, P2p, D2h, H2d, Other };
constexpr int kLanes = 6;
const char* to_string(Lane lane);  // the stream's name (trace::stream), "other" for Lane::Other
Lane lane_of_stream(const std::string& name);

// What a compute span is ("cat"): a unit's forward, input-gradient backward or weight gradient,
// an op of the schedule (the units of one op nest inside it), a whole training step, or other.
enum class Kind : std::uint8_t { F, B, W, Op, Step, Other };
Kind kind_of_category(const std::string& cat);

struct Span {
  double ts = 0, end = 0;  // µs since the recorder started
  int pid = 0;             // global rank
  Lane lane = Lane::Other;
  Kind kind = Kind::Other;
  std::uint32_t name = 0;   // Trace::strings index
  std::uint32_t part = 0;   // args.part, e.g. "F0.3" (0 = none)
  double bytes = -1;        // args.bytes (-1 = none)
  int chunk = -1, mb = -1;  // args.chunk, args.mb (-1 = none)
  double dur() const { return end - ts; }
};

struct Counter {
  double ts = 0;  // µs
  int pid = 0;
  std::uint32_t track = 0;           // Trace::strings index: a trace::track name
  std::uint32_t begin = 0, end = 0;  // its series in Trace::values
};

struct Trace {
  std::vector<std::string> strings{""};                  // interned; 0 = empty
  std::vector<Span> spans;                               // file order
  std::vector<Counter> counters;                         // file order
  std::vector<std::pair<std::uint32_t, double>> values;  // (series name id, value)

  const std::string& str(std::uint32_t id) const { return strings[id]; }
  // The id of `s` if it was interned, else 0 (no span can then carry it).
  std::uint32_t find(const std::string& s) const;
  // Sum of a counter's series.
  double total(const Counter& c) const;
};

}  // namespace stp::profile
