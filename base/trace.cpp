#include "base/trace.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "base/error.h"
#include "base/trace_names.h"

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

void TraceRecorder::add_counter(TraceCounter counter) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.push_back(std::move(counter));
}

std::vector<TraceSpan> TraceRecorder::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

std::vector<TraceCounter> TraceRecorder::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int known_stream_tid(const std::string& stream) {
  using namespace trace::stream;
  static const char* const kKnown[] = {kCompute, kTpComm, kP2p, kD2h, kH2d};
  for (int i = 0; i < 5; ++i)
    if (stream == kKnown[i]) return i + 1;
  return 0;
}

void TraceArgs::begin_member(std::string_view key) {
  json_.pop_back();  // the closing brace, put back by the value
  if (json_.size() > 1) json_ += ',';
  json_ += '"';
  json_ += json_escape(key);
  json_ += "\":";
}

void TraceArgs::append_bool(bool v) { json_ += v ? "true}" : "false}"; }

void TraceArgs::append_int(std::int64_t v) {
  json_ += std::to_string(v);
  json_ += '}';
}

void TraceArgs::append_uint(std::uint64_t v) {
  json_ += std::to_string(v);
  json_ += '}';
}

void TraceArgs::append_string(std::string_view v) {
  json_ += '"';
  json_ += json_escape(v);
  json_ += "\"}";
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

// Integers (byte counts) exactly, anything else with 9 significant digits; never NaN/inf (not JSON).
std::string counter_value(double v) {
  char buf[40];
  if (!std::isfinite(v)) v = 0;
  if (v == std::floor(v) && std::fabs(v) < 9e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

// Written by hand rather than through nlohmann-json, which the other documents use: a trace holds
// about a million events, and building and dumping one nlohmann::ordered_json per event (args
// re-parsed from its JSON) took 4.2-4.4 s of CPU for 1M events against 2.5-2.9 s for these
// appends (same document, same run, 3 repetitions). Strings go through json_escape, the one
// escape function, which writes what nlohmann writes.
std::string TraceRecorder::to_json() const {
  std::vector<TraceSpan> spans;
  std::vector<TraceCounter> counters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spans = spans_;
    counters = counters_;
  }
  // Numeric tids: the five known streams by name, others in order of first appearance per rank.
  std::map<std::pair<int, std::string>, int> tids;
  std::map<int, int> next_tid;
  std::set<int> pids;
  for (const TraceSpan& s : spans) {
    pids.insert(s.pid);
    auto key = std::make_pair(s.pid, s.tid);
    if (tids.count(key)) continue;
    int known = known_stream_tid(s.tid);
    if (!known) {
      int& n = next_tid.try_emplace(s.pid, 6).first->second;
      known = n++;
    }
    tids.emplace(key, known);
  }
  for (const TraceCounter& c : counters) pids.insert(c.pid);

  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& body) {
    if (!first) out += ",\n";
    out += body;
    first = false;
  };
  for (int pid : pids) {
    std::string p = std::to_string(pid);
    event("{\"ph\":\"M\",\"pid\":" + p + ",\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank " + p +
          "\"}}");
    event("{\"ph\":\"M\",\"pid\":" + p + ",\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" + p +
          "}}");
  }
  for (const auto& [key, tid] : tids) {
    std::string head = "{\"ph\":\"M\",\"pid\":" + std::to_string(key.first) + ",\"tid\":" + std::to_string(tid);
    event(head + ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + json_escape(key.second) + "\"}}");
    event(head + ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}");
  }
  char num[96];
  for (const TraceSpan& s : spans) {
    std::string e = "{\"ph\":\"X\",\"pid\":" + std::to_string(s.pid) +
                    ",\"tid\":" + std::to_string(tids.at({s.pid, s.tid})) + ",\"name\":\"" + json_escape(s.name) +
                    "\",\"cat\":\"" + json_escape(s.category) + "\"";
    std::snprintf(num, sizeof num, ",\"ts\":%.3f,\"dur\":%.3f", s.ts_us, s.dur_us);
    e += num;
    e += ",\"args\":" + s.args.json() + "}";
    event(e);
  }
  for (const TraceCounter& c : counters) {
    std::snprintf(num, sizeof num, ",\"ts\":%.3f", c.ts_us);
    std::string e = "{\"ph\":\"C\",\"pid\":" + std::to_string(c.pid) + ",\"tid\":0,\"name\":\"" + json_escape(c.name) +
                    "\"" + num + ",\"args\":{";
    for (std::size_t i = 0; i < c.series.size(); ++i)
      e += (i ? ",\"" : "\"") + json_escape(c.series[i].first) + "\":" + counter_value(c.series[i].second);
    event(e + "}}");
  }
  return out + "\n]}\n";
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
