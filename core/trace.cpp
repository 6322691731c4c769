#include "core/trace.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace stp {

static double steady_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

TraceRecorder::TraceRecorder() : origin_us_(steady_us()) {}

double TraceRecorder::now_us() const { return steady_us() - origin_us_; }

void TraceRecorder::add(TraceSpan span) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(span));
}

std::vector<TraceSpan> TraceRecorder::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string TraceRecorder::to_json() const {
  auto spans_copy = spans();
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  char num[96];
  for (std::size_t i = 0; i < spans_copy.size(); ++i) {
    const TraceSpan& s = spans_copy[i];
    out += "{\"ph\":\"X\",\"pid\":" + std::to_string(s.pid) + ",\"tid\":\"" + json_escape(s.tid) +
           "\",\"name\":\"" + json_escape(s.name) + "\",\"cat\":\"" + json_escape(s.category) + "\"";
    std::snprintf(num, sizeof num, ",\"ts\":%.3f,\"dur\":%.3f", s.ts_us, s.dur_us);
    out += num;
    out += ",\"args\":" + (s.args_json.empty() ? std::string("{}") : s.args_json) + "}";
    out += i + 1 < spans_copy.size() ? ",\n" : "\n";
  }
  return out + "]}\n";
}

void TraceRecorder::write(const std::string& path) const {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    STP_CHECK(f.good(), "cannot write trace file '", tmp, "'");
    f << to_json();
    STP_CHECK(f.good(), "error while writing trace file '", tmp, "'");
  }
  STP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "'");
}

}  // namespace stp
