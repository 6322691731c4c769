// Chrome trace renderer (docs/design.md, Files; trace shape: pid = rank, tid = stream). One time unit = 1 ms.
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/trace_names.h"
#include "schedule/render.h"

namespace stp::sched {

std::string render_trace(const Schedule& s, const SimResult& r, const Costs& c) {
  using nlohmann::ordered_json;
  static const char* kPass[] = {"F", "B", "W"};
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  auto event = [&](const ordered_json& e) {  // one event per line
    out += first ? "\n" : ",\n";
    out += e.dump();
    first = false;
  };
  auto thread_name = [&](int k, int tid, const char* name) {
    event({{"name", "thread_name"}, {"ph", "M"}, {"pid", k}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  for (int k = 0; k < s.pp; ++k) {
    event({{"name", "process_name"}, {"ph", "M"}, {"pid", k}, {"args", {{"name", str("rank ", k)}}}});
    thread_name(k, 0, trace::stream::kCompute);
    thread_name(k, 1, trace::stream::kTpComm);
    for (std::size_t i = 0; i < s.ranks[k].size(); ++i) {
      const Op& op = s.ranks[k][i];
      for (const Segment& seg : op_segments(op, c, r.times[k][i].start)) {
        const Part& p = op.part(seg.part);
        std::string name = seg.stream == 0 ? str(kPass[static_cast<int>(seg.pass)], p.chunk, ".", p.mb)
                                           : str("AR ", kPass[static_cast<int>(seg.pass)], p.chunk, ".", p.mb);
        event({{"name", name},
               {"cat", to_string(op)},
               {"ph", "X"},
               {"pid", k},
               {"tid", seg.stream},
               {"ts", number_json(seg.start * 1000)},
               {"dur", number_json((seg.end - seg.start) * 1000)}});
      }
    }
  }
  return out + "\n],\"displayTimeUnit\":\"ms\"}\n";
}

}  // namespace stp::sched
