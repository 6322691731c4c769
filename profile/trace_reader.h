// Reading a trace into profile::Trace (trace_events.h).
//
// The reader walks the text once with simdjson's On Demand API: it accepts the object form
// {"traceEvents":[…], …} and the bare array form, keeps "X" spans, "C" counters and the "M"
// thread_name metadata that names numeric tids, and skips every other event and key without
// building a document tree (a tree reader such as nlohmann-json is ~10x slower and takes many times
// the memory on a million events). Strings are interned. It replaced a hand-written scanner that
// was ~20% slower (docs/profile.md, "Speed").
//
// Errors are stp::Error naming the source (the file path) and what is wrong: a file that cannot
// be read, malformed JSON (with the byte offset), a file that ends early ("truncated"), an "X"
// event without "ts"/"dur" or with a negative duration, a non-numeric pid.
#pragma once

#include <string>
#include <string_view>

#include "base/trace.h"
#include "profile/trace_events.h"

namespace stp::profile {

Trace read_trace_file(const std::string& path);
Trace parse_trace(std::string_view json, const std::string& source);

// The spans and counters of an in-memory recorder (a trace not written yet), same result as
// writing it and reading the file back.
Trace from_recorder(const TraceRecorder& recorder);

}  // namespace stp::profile
