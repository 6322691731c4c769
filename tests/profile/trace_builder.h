// Test helper: a Chrome trace written by hand, event by event, in the shape `stp train` writes
// (base/trace.h): numeric tids named by thread_name metadata, times in µs.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "base/error.h"

namespace stp::testing {

class TraceBuilder {
 public:
  // A complete span of `stream` ("compute", "tp-comm", "p2p", "d2h", "h2d" or any other name).
  TraceBuilder& x(int pid, const std::string& stream, const std::string& name, const std::string& cat, double ts,
                  double dur, const std::string& args = "{}") {
    add(str("{\"ph\":\"X\",\"pid\":", pid, ",\"tid\":", tid(pid, stream), ",\"name\":\"", name, "\",\"cat\":\"", cat,
            "\",\"ts\":", exact(ts), ",\"dur\":", exact(dur), ",\"args\":", args, "}"));
    return *this;
  }
  // A counter sample, e.g. c(0, "device memory", 5, "{\"weights\":10,\"activations\":20}").
  TraceBuilder& c(int pid, const std::string& name, double ts, const std::string& args) {
    add(str("{\"ph\":\"C\",\"pid\":", pid, ",\"tid\":0,\"name\":\"", name, "\",\"ts\":", exact(ts), ",\"args\":", args,
            "}"));
    return *this;
  }
  TraceBuilder& raw(const std::string& event) {
    add(event);
    return *this;
  }
  // Metadata last, as a trace may put it anywhere.
  std::string json() const {
    std::string meta;
    for (const auto& [key, id] : tids_)
      meta += str(",\n{\"ph\":\"M\",\"pid\":", key.first, ",\"tid\":", id,
                  ",\"name\":\"thread_name\",\"args\":{\"name\":\"", key.second, "\"}}");
    return "{\"traceEvents\":[\n" + events_ + meta + "\n],\"displayTimeUnit\":\"ms\"}\n";
  }

 private:
  static std::string exact(double v) {  // every bit of the double
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
  }
  int tid(int pid, const std::string& stream) {
    auto [it, fresh] = tids_.try_emplace({pid, stream}, static_cast<int>(tids_.size()) + 11);
    return it->second;
  }
  void add(const std::string& e) {
    if (!events_.empty()) events_ += ",\n";
    events_ += e;
  }
  std::string events_;
  std::map<std::pair<int, std::string>, int> tids_;
};

}  // namespace stp::testing
